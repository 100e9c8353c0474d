#include "dtensor/graph/training.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "dtensor/errors.h"

namespace dtensor::graph {
namespace {

// Indexes of the loss and of the gradients among the user-visible outputs run() returns (buffer
// mutations are applied to the state, not returned).
struct JointOutputs {
  size_t loss = 0;
  std::vector<std::pair<size_t, std::string>> gradients;  // (index, parameter)
};

JointOutputs joint_outputs(const Program& program) {
  JointOutputs out;
  bool loss = false;
  size_t index = 0;
  for (const OutputSpec& spec : program.outputs) {
    if (spec.kind == OutputSpec::Kind::BufferMutation) continue;
    if (spec.kind == OutputSpec::Kind::LossOutput) {
      out.loss = index;
      loss = true;
    }
    if (spec.kind == OutputSpec::Kind::GradientToParameter) out.gradients.emplace_back(index, spec.target);
    ++index;
  }
  if (!loss || out.gradients.empty())
    throw DTensorError("graph training: " + (program.source.empty() ? std::string("the program") : program.source) +
                       " is not a joint forward+backward program (it needs a LOSS_OUTPUT and GRADIENT_TO_PARAMETER "
                       "outputs; torch.export.experimental._export_forward_backward makes one)");
  return out;
}

}  // namespace

std::vector<at::Tensor> joint_parameters(Program& program) {
  std::vector<at::Tensor> out;
  for (const auto& [index, name] : joint_outputs(program).gradients) out.push_back(program.state.at(name).tensor());
  return out;
}

at::Tensor take_joint_outputs(Program& program, const std::vector<at::Tensor>& outputs) {
  const JointOutputs layout = joint_outputs(program);
  for (const auto& [index, name] : layout.gradients) {
    if (index >= outputs.size())
      throw DTensorError("graph training: " + program.source + " has " + std::to_string(index + 1) + " or more outputs, got " +
                         std::to_string(outputs.size()));
    at::Tensor parameter = program.state.at(name).tensor();
    parameter.mutable_grad() = outputs[index];
  }
  return outputs.at(layout.loss);
}

at::Tensor joint_step(Program& program, const std::vector<c10::IValue>& user_inputs, const RunOptions& options, RunStats* stats) {
  std::vector<at::Tensor> outputs;
  for (const c10::IValue& out : run(program, user_inputs, options, stats)) outputs.push_back(out.toTensor());
  return take_joint_outputs(program, outputs);
}

std::vector<double> train_steps(Program& program, torch::optim::Optimizer& optimizer, const std::vector<c10::IValue>& user_inputs,
                                int steps) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    losses.push_back(joint_step(program, user_inputs).item<double>());
    optimizer.step();
  }
  return losses;
}

}  // namespace dtensor::graph
