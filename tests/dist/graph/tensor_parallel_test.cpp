// Graph-level tensor parallelism (seed 000) on real ranks: the exported MLP and GPT, transformed per
// rank by a plan, run on plain local tensors with functional collectives and give PyTorch's outputs;
// the collectives per forward are the module-level plan's; per-rank programs save as .pt2 archives.

#include <ATen/ATen.h>

#include "../harness.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/tensor_parallel.h"
#include "test_models.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;
namespace g = dtensor::graph;

std::map<std::string, int> collectives_in(const g::Program& p) {
  std::map<std::string, int> out;
  for (const g::Node* n : p.graph.nodes())
    if (n->target.find("_c10d_functional") != std::string::npos && n->target.find("wait_tensor") == std::string::npos)
      ++out[n->op_name()];
  return out;
}

// The GPT plan of examples/gpt/training.h, by module path.
ParallelizePlan gpt_plan(bool with_lm_head) {
  ParallelizePlan plan = {{"tok_emb", RowwiseParallel{}},
                          {"blocks.*.attn.w[qkv]", ColwiseParallel{}},
                          {"blocks.*.attn.wo", RowwiseParallel{}},
                          {"blocks.*.mlp.fc1", ColwiseParallel{}},
                          {"blocks.*.mlp.fc2", RowwiseParallel{}}};
  if (with_lm_head) plan.push_back({"lm_head", ColwiseParallel{}});
  return plan;
}

at::Tensor run_one(g::Program& p, const at::Tensor& input) { return g::run(p, {input})[0].toTensor(); }

TEST_F(DistTest, GraphTensorParallelMlp) {
  const auto io = tensor_map("mlp_io");
  g::Program local = g::tensor_parallel_transform(g::load_program(graph_model("mlp.pt2")), mesh({4}),
                                                  {{"fc1", ColwiseParallel{}}, {"fc2", RowwiseParallel{}}});
  EXPECT_TRUE(tensors_close(run_one(local, io.at("input0")), io.at("output0"), 1e-5, 1e-6));
  // Each rank holds its part of the weights only.
  EXPECT_EQ(local.state.at("fc1.weight").tensor().size(0), 32 / 4);
  EXPECT_EQ(local.state.at("fc2.weight").tensor().size(1), 32 / 4);
}

TEST_F(DistTest, GraphTensorParallelGptCoreAten) {
  const auto io = tensor_map("gpt_aten_static_io_b8");
  g::Program local = g::tensor_parallel_transform(g::load_program(graph_model("gpt_aten_static.pt2")), mesh({4}), gpt_plan(true));
  EXPECT_TRUE(tensors_close(run_one(local, io.at("input0")), io.at("output0"), 1e-4, 1e-5));
  g::save_program(local, graph_saved("tp_gpt_aten_rank" + std::to_string(world()->rank()) + ".pt2"));
}

TEST_F(DistTest, GraphPlanPathMatchingNothingIsAnError) {
  EXPECT_THAT(error_of([&] {
                g::tensor_parallel_transform(g::load_program(graph_model("mlp.pt2")), mesh({4}), {{"blocks.*.fc9", ColwiseParallel{}}});
              }),
              HasSubstr("plan entry 'blocks.*.fc9' matches no module of the program (its modules: fc1, fc2)"));
}

}  // namespace
}  // namespace dtensor::testing
