// Graph-level tensor parallelism (seed 000) on real ranks: the exported MLP and GPT, transformed per
// rank by a plan, run on plain local tensors with functional collectives and give PyTorch's outputs;
// the collectives per forward are the module-level plan's; per-rank programs save as .pt2 archives.

#include <ATen/ATen.h>

#include "../harness.h"
#include "expect_saves.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/tensor_parallel.h"
#include "gpt/graph_plan.h"
#include "../../support/test_models.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;
namespace g = dtensor::graph;

using gpt::graph_plan;

at::Tensor run_one(g::Program& p, const at::Tensor& input) { return g::run(p, {input})[0].toTensor(); }

class GraphTensorParallelTest : public DistTest {};

TEST_F(GraphTensorParallelTest, TensorParallelMlp) {
  const auto io = tensor_map("mlp_io");
  g::Program local = g::tensor_parallel_transform(g::load_program(graph_model("mlp.pt2")), mesh({4}),
                                                  {{"fc1", ColwiseParallel{}}, {"fc2", RowwiseParallel{}}});
  EXPECT_TRUE(tensors_close(run_one(local, io.at("input0")), io.at("output0"), 1e-5, 1e-6));
  // Megatron's MLP: one all-reduce after the row-parallel layer, nothing else.
  EXPECT_EQ(collectives_in(local), (std::map<std::string, int>{{"_c10d_functional::all_reduce", 1}}));
  // Each rank holds its part of the weights only.
  EXPECT_EQ(local.state.at("fc1.weight").tensor().size(0), 32 / 4);
  EXPECT_EQ(local.state.at("fc2.weight").tensor().size(1), 32 / 4);
  expect_saves(local, "mlp", {io.at("input0")});
}

TEST_F(GraphTensorParallelTest, TensorParallelGptTrainingIr) {
  const auto io = tensor_map("gpt_train_ir_static_io_b8");
  g::Program local =
      g::tensor_parallel_transform(g::load_program(graph_model("gpt_train_ir_static.pt2")), mesh({4}), graph_plan(true));
  EXPECT_TRUE(tensors_close(run_one(local, io.at("input0")), io.at("output0"), 1e-4, 1e-5));
  EXPECT_EQ(collectives_in(local), gpt_module_level_collectives()) << local.str();
  expect_saves(local, "gpt_train_ir", {io.at("input0")});
}

// With lm_head replicated, the whole-graph choice (strategy_choice.h) ends differently from module
// level: instead of all-reducing the last residual (2 x 3/4 of [8, 32, 128] per rank), it
// reduce-scatters it over the batch, runs the final layer norm and lm_head on a quarter of the batch,
// and gathers the much smaller logits ([8, 32, 42]): fewer bytes moved, and a quarter of lm_head's work.
TEST_F(GraphTensorParallelTest, TensorParallelGptReplicatedHeadRunsOnABatchShard) {
  const auto io = tensor_map("gpt_train_ir_static_io_b8");
  g::Program local =
      g::tensor_parallel_transform(g::load_program(graph_model("gpt_train_ir_static.pt2")), mesh({4}), graph_plan(false));
  EXPECT_TRUE(tensors_close(run_one(local, io.at("input0")), io.at("output0"), 1e-4, 1e-5));
  EXPECT_EQ(collectives_in(local), (std::map<std::string, int>{{"_c10d_functional::all_reduce", 2 * kGptLayers},
                                                               {"_c10d_functional::reduce_scatter_tensor", 1},
                                                               {"_c10d_functional::all_gather_into_tensor", 1}}))
      << local.str();
  expect_saves(local, "gpt_replicated_head", {io.at("input0")});
}

// TP over one dim of a 2x2 mesh: the other dim holds replicas, which compute alike.
TEST_F(GraphTensorParallelTest, TensorParallelGptOnTwoDimMesh) {
  const auto io = tensor_map("gpt_train_ir_static_io_b8");
  const MeshPtr m = mesh({2, 2}, {}, {"dp", "tp"});
  g::Program local = g::tensor_parallel_transform(g::load_program(graph_model("gpt_train_ir_static.pt2")), m, graph_plan(true),
                                                  {.tp_dim = "tp"});
  EXPECT_TRUE(tensors_close(run_one(local, io.at("input0")), io.at("output0"), 1e-4, 1e-5));
  EXPECT_EQ(collectives_in(local), gpt_module_level_collectives());
  EXPECT_EQ(local.state.at("blocks.0.mlp.fc1.weight").tensor().size(0), 512 / 2);
  expect_saves(local, "gpt_2d_mesh", {io.at("input0")});
}

TEST_F(GraphTensorParallelTest, TensorParallelGptCoreAten) {
  const auto io = tensor_map("gpt_aten_static_io_b8");
  g::Program local = g::tensor_parallel_transform(g::load_program(graph_model("gpt_aten_static.pt2")), mesh({4}), graph_plan(true));
  EXPECT_TRUE(tensors_close(run_one(local, io.at("input0")), io.at("output0"), 1e-4, 1e-5));
  // Core ATen merges batch and heads before bmm; lifted back to 4-d matmuls, the heads stay sharded
  // and the collectives are module level's (no head all-gathers).
  EXPECT_EQ(collectives_in(local), gpt_module_level_collectives()) << local.str();
  expect_saves(local, "gpt_aten", {io.at("input0")});
}

TEST_F(GraphTensorParallelTest, PlanPathMatchingNothingIsAnError) {
  EXPECT_THAT(error_of([&] {
                g::tensor_parallel_transform(g::load_program(graph_model("mlp.pt2")), mesh({4}), {{"blocks.*.fc9", ColwiseParallel{}}});
              }),
              HasSubstr("plan entry 'blocks.*.fc9' matches no module of the program (its modules: fc1, fc2)"));
}

}  // namespace
}  // namespace dtensor::testing
