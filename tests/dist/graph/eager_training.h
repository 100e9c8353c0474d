#pragma once
// The eager training tests' loop: a program that returns a loss (forward(input_ids, labels), the
// training IR) run by graph::run on DTensors after graph::distribute_program, autograd for its
// backward, as a PyTorch user trains the eager model after parallelize_module; and the same program
// run in one process on plain tensors, its oracle.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "../../support/tensor_assertions.h"
#include "dtensor/api.h"
#include "dtensor/graph/program.h"
#include "dtensor/sharding.h"

namespace dtensor::testing {

// The program's loss on `inputs`, with autograd's gradients in its parameters.
inline at::Tensor eager_loss(graph::Program& program, const std::vector<c10::IValue>& inputs) {
  // The rotary tables and masks the program makes are plain tensors, also where the backward reads them.
  const ImplicitReplicationGuard tables_replicated;
  const at::Tensor loss = graph::run(program, inputs)[0].toTensor();
  loss.backward();
  return loss;
}

// The program's parameters in one process (its state as read), requiring gradients, in input order.
inline std::vector<at::Tensor> whole_parameters(graph::Program& program) {
  std::vector<at::Tensor> parameters;
  for (const graph::InputSpec& spec : program.inputs)
    if (spec.kind == graph::InputSpec::Kind::Parameter) {
      at::Tensor t = program.state.at(spec.target).tensor().clone().requires_grad_(true);
      program.state[spec.target] = graph::StateTensor(t);
      parameters.push_back(t);
    }
  return parameters;
}

// One eager step's loss and every parameter's gradient (`parameters` in input order) equal `io`'s
// "loss" and "grad.NAME" (PyTorch's eager model, scripts/export_*_models.py).
inline void expect_eager_step_matches(graph::Program& program, const std::vector<at::Tensor>& parameters,
                                      const std::vector<c10::IValue>& inputs, const std::map<std::string, at::Tensor>& io) {
  const at::Tensor loss = eager_loss(program, inputs);
  EXPECT_TRUE(tensors_close(full_tensor(loss), io.at("loss"), 1e-5, 1e-6));
  size_t k = 0;
  for (const graph::InputSpec& spec : program.inputs)
    if (spec.kind == graph::InputSpec::Kind::Parameter)
      EXPECT_TRUE(tensors_close(full_tensor(parameters[k++].grad()), io.at("grad." + spec.target), 1e-4, 1e-5)) << spec.target;
}

// Losses of `steps` eager AdamW steps (learning rate 1e-2) on the same inputs.
inline std::vector<double> eager_adamw_losses(graph::Program& program, const std::vector<at::Tensor>& parameters,
                                              const std::vector<c10::IValue>& inputs, int steps) {
  torch::optim::AdamW adamw(parameters, torch::optim::AdamWOptions(1e-2));
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    adamw.zero_grad();
    const at::Tensor loss = eager_loss(program, inputs);
    losses.push_back((is_dtensor(loss) ? full_tensor(loss) : loss).item<double>());
    adamw.step();
  }
  return losses;
}

// 5 eager AdamW steps of the distributed program follow those of `whole` in one process (relative
// 1e-4), and the loss falls.
inline void expect_eager_adamw_follows_whole(graph::Program& program, const std::vector<at::Tensor>& parameters,
                                             const std::vector<c10::IValue>& inputs, graph::Program& whole,
                                             const std::vector<c10::IValue>& whole_inputs) {
  constexpr int kSteps = 5;
  const std::vector<double> losses = eager_adamw_losses(program, parameters, inputs, kSteps),
                            expected = eager_adamw_losses(whole, whole_parameters(whole), whole_inputs, kSteps);
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(losses[s], expected[s], 1e-4 * std::abs(expected[s])) << "step " << s;
  EXPECT_LT(losses.back(), losses.front());
}

}  // namespace dtensor::testing
