// Hugging Face Llama at module level under context parallelism x tensor parallelism: its forward and
// loss (the training IR of scripts/export_context_parallel_models.py, causal flash attention,
// grouped-query heads) run eagerly on DTensors, as a PyTorch user runs the eager model under
// parallelize_module and context_parallel. The weights are placed by the model's own tensor-parallel
// plan over "tp" (replicated over "cp"), the input ids and next-token labels Shard(1) over "cp";
// autograd runs the backward. The loss and every gradient equal PyTorch's eager model's, and 5 AdamW
// steps follow the program trained eagerly in one process.

#include <ATen/ATen.h>

#include "../harness.h"
#include "../../support/test_models.h"
#include "dtensor/api.h"
#include "dtensor/comm_debug.h"
#include "dtensor/graph/eager.h"
#include "dtensor/graph/hugging_face.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/tensor_parallel.h"
#include "eager_training.h"

namespace dtensor::testing {
namespace {

namespace g = dtensor::graph;

class EagerContextParallelTest : public DistTest {};

TEST_F(EagerContextParallelTest, HuggingFaceLlamaOnCpTimesTpMatchesItsEagerModel) {
  const MeshPtr m = mesh({2, 2}, {}, {"cp", "tp"});
  const std::string archive = graph_model("cp/llama_causal_loss_train_ir.pt2");
  const auto io = tensor_map("cp/llama_causal_joint_io");
  g::Program llama = g::load_program(archive);
  const auto weights = g::plan_placements(llama, *m, g::hugging_face_plan(graph_model_text("hf/llama_tp_plan.json"), "", "llama_tp_plan.json"),
                                          {.tp_dim = "tp"});
  const std::vector<at::Tensor> parameters = g::distribute_program(llama, m, weights);
  const Placements sequence{Shard(1), Replicate()};
  const std::vector<c10::IValue> inputs = {distribute_tensor(io.at("input0"), m, sequence), distribute_tensor(io.at("input1"), m, sequence)};

  CommDebugMode comm;
  expect_eager_step_matches(llama, parameters, inputs, io);
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
  g::Program whole = g::load_program(archive);
  expect_eager_adamw_follows_whole(llama, parameters, inputs, whole, {io.at("input0"), io.at("input1")});
}

}  // namespace
}  // namespace dtensor::testing
