// Hugging Face Llama at module level under context parallelism x tensor parallelism: its forward and
// loss (the training IR of scripts/export_context_parallel_models.py, causal flash attention,
// grouped-query heads) run eagerly on DTensors, as a PyTorch user runs the eager model under
// parallelize_module and context_parallel. The weights are placed by the model's own tensor-parallel
// plan over "tp" (replicated over "cp"), the input ids and next-token labels Shard(1) over "cp";
// autograd runs the backward. The loss and every gradient equal PyTorch's eager model's, and 5 AdamW
// steps follow the program trained eagerly in one process.

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "../harness.h"
#include "../../support/test_models.h"
#include "dtensor/api.h"
#include "dtensor/comm_debug.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/graph/hugging_face.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/tensor_parallel.h"
#include "dtensor/sharding.h"

namespace dtensor::testing {
namespace {

namespace g = dtensor::graph;

// The program's parameters (and its other state) made `placed(name, whole tensor)`, parameters
// requiring gradients.
template <typename Place>
std::vector<at::Tensor> place_state(g::Program& program, Place placed) {
  std::vector<at::Tensor> parameters;
  for (const g::InputSpec& spec : program.inputs) {
    if (spec.kind == g::InputSpec::Kind::UserInput) continue;
    at::Tensor t = placed(spec.target, program.state.at(spec.target).tensor());
    if (spec.kind == g::InputSpec::Kind::Parameter) parameters.push_back(t.requires_grad_(true));
    program.state[spec.target] = g::StateTensor(t);
  }
  return parameters;
}

// The loss of the program on `inputs`, eagerly, with autograd's gradients in its parameters.
at::Tensor eager_loss(g::Program& program, const std::vector<c10::IValue>& inputs) {
  at::Tensor loss;
  {
    const ImplicitReplicationGuard tables_replicated;  // the rotary tables and masks the program makes are plain tensors
    loss = g::run(program, inputs)[0].toTensor();
  }
  loss.backward();
  return loss;
}

// Losses of `steps` eager AdamW steps (learning rate 1e-2) on the same inputs.
std::vector<double> eager_adamw_losses(g::Program& program, const std::vector<at::Tensor>& parameters, const std::vector<c10::IValue>& inputs,
                                       int steps) {
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

class EagerContextParallelTest : public DistTest {};

TEST_F(EagerContextParallelTest, HuggingFaceLlamaOnCpTimesTpMatchesItsEagerModel) {
  const MeshPtr m = mesh({2, 2}, {}, {"cp", "tp"});
  const std::string archive = graph_model("cp/llama_causal_loss_train_ir.pt2");
  const auto io = tensor_map("cp/llama_causal_joint_io");
  g::Program llama = g::load_program(archive);
  const auto weights = g::plan_placements(llama, *m, g::hugging_face_plan(graph_model_text("hf/llama_tp_plan.json"), "", "llama_tp_plan.json"),
                                          {.tp_dim = "tp"});
  const std::vector<at::Tensor> parameters = place_state(llama, [&](const std::string& name, const at::Tensor& whole) {
    const auto placed = weights.find(name);
    return distribute_tensor(whole, m, placed == weights.end() ? Placements(2, Replicate()) : placed->second);
  });
  const Placements sequence{Shard(1), Replicate()};
  const std::vector<c10::IValue> inputs = {distribute_tensor(io.at("input0"), m, sequence), distribute_tensor(io.at("input1"), m, sequence)};

  CommDebugMode comm;
  const at::Tensor loss = eager_loss(llama, inputs);
  EXPECT_TRUE(tensors_close(full_tensor(loss), io.at("loss"), 1e-5, 1e-6));
  size_t k = 0;
  for (const g::InputSpec& spec : llama.inputs)
    if (spec.kind == g::InputSpec::Kind::Parameter)
      EXPECT_TRUE(tensors_close(full_tensor(parameters[k++].grad()), io.at("grad." + spec.target), 1e-4, 1e-5)) << spec.target;
  // Attention, forward and backward, runs as the ring over cp: its key/value blocks are sent around,
  // and the sequence is neither gathered nor exchanged for another dim.
  int attention_ops = 0;
  for (const auto& [op, kinds] : comm.counts_by_op()) {
    if (op.find("flash_attention") == std::string::npos) continue;
    ++attention_ops;
    EXPECT_GT(kinds.count("send"), 0) << op << "\n" << comm.summary();
    EXPECT_EQ(kinds.count("all-gather") + kinds.count("all-to-all"), 0) << op << "\n" << comm.summary();
  }
  EXPECT_EQ(attention_ops, 2) << comm.summary();

  // 5 AdamW steps follow the program trained eagerly in one process.
  constexpr int kSteps = 5;
  g::Program whole = g::load_program(archive);
  const std::vector<at::Tensor> whole_parameters = place_state(whole, [](const std::string&, const at::Tensor& t) { return t.clone(); });
  const std::vector<double> losses = eager_adamw_losses(llama, parameters, inputs, kSteps),
                            expected = eager_adamw_losses(whole, whole_parameters, {io.at("input0"), io.at("input1")}, kSteps);
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(losses[s], expected[s], 1e-4 * std::abs(expected[s])) << "step " << s;
  EXPECT_LT(losses.back(), losses.front());
}

}  // namespace
}  // namespace dtensor::testing
