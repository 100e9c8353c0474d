// SPMD expansion over a sequence-sharded mesh dim, context parallelism at graph level: the joint program
// of the test GPT with fused causal attention (scripts/export_context_parallel_models.py), its tokens and
// targets Shard(1) over "cp" (on cp x tp its weights also placed by the GPT plan over "tp"), trains like
// the one-process program: the loss, every gradient, and 6 AdamW steps; and Hugging Face Llama likewise
// against its eager model. With SpmdOptions::context_parallel_dim every attention node, forward and
// backward, runs on sequence shards over cp (context-parallel attention). Each program saves
// (the sequence kernels' graph form) for PyTorch to run on every rank against dtensor's interpreter
// (ctest graph_saved_programs_run_in_pytorch).

#include <ATen/ATen.h>

#include "../harness.h"
#include "adamw_losses.h"
#include "expect_saves.h"
#include "joint_step_matches.h"
#include "sequence_parallel_norms.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/hugging_face.h"
#include "dtensor/graph/spmd.h"
#include "dtensor/graph/training.h"
#include "gpt/graph_plan.h"
#include "../../support/test_models.h"

namespace dtensor::testing {
namespace {

namespace g = dtensor::graph;

struct SequenceLayout {
  std::string name;
  Shape mesh_shape;
  std::vector<std::string> dims;
};

g::Program fused_gpt() { return g::load_program(graph_model("cp/gpt_fused_joint.pt2")); }

g::Program expanded_fused_gpt(const MeshPtr& m) {
  g::Program whole = fused_gpt();
  g::SpmdPlacements where;
  Placements sequence(m->ndim(), Replicate());
  sequence[m->dim_index("cp")] = Shard(1);
  where.user_inputs.assign(whole.user_inputs().size(), sequence);
  if (m->ndim() == 2) where.state = g::plan_placements(whole, *m, gpt::graph_plan(true), {.tp_dim = "tp"});
  return g::spmd_expand(std::move(whole), m, where, {.context_parallel_dim = "cp"});
}

// The flash attention calls (forward and backward) of `program`, and how many of them attend only this
// rank's block of queries (the first argument, queries or their output's gradient, shorter than the
// sequence): the sequence kernels' graph form writes such calls, on its rank's blocks.
std::pair<int, int> attention_on_own_queries(const g::Program& program, int64_t sequence) {
  int attention = 0, own = 0;
  for (const g::Node* node : program.graph.nodes()) {
    if (node->op_name().find("_scaled_dot_product_flash_attention_for_cpu") == std::string::npos) continue;
    ++attention;
    own += node->args()[0].values[0]->meta.shape[2] < sequence;
  }
  return {attention, own};
}

class GraphSpmdContextParallel : public DistTest, public ::testing::WithParamInterface<SequenceLayout> {};

TEST_P(GraphSpmdContextParallel, FusedGptTrainsLikeOneProcess) {
  const SequenceLayout& layout = GetParam();
  const MeshPtr m = mesh(layout.mesh_shape, {}, layout.dims);
  const auto io = tensor_map("cp/gpt_fused_joint_io");
  const std::vector<c10::IValue> inputs = {io.at("input0"), io.at("input1")};
  g::Program step = expanded_fused_gpt(m);
  const auto local_inputs = g::local_user_inputs(step, inputs);
  expect_saves(step, "spmd_joint_gpt_fused_" + layout.name, local_inputs);
  expect_joint_step_matches(step, local_inputs, io, m);
  const int64_t sequence = io.at("input0").size(1);
  const auto [attention, own] = attention_on_own_queries(step, sequence);
  EXPECT_GE(attention, 2 * kGptLayers);  // per layer a forward and a backward, or their forms' calls
  EXPECT_EQ(own, attention);

  // 6 steps: by the 8th the model has all but memorised its one batch of 64 random tokens (the loss
  // falls from 3.8 to 0.16), and AdamW's normalised updates have grown the 1e-7 rounding differences of
  // summing over ranks past 1e-4 of so small a loss (1.6e-4 at step 8, 8e-4 at step 10, on cp4 and
  // cp2tp2 alike).
  constexpr int kSteps = 6;
  g::Program fresh = expanded_fused_gpt(m), whole = fused_gpt();
  const std::vector<double> losses = adamw_losses(fresh, local_inputs, kSteps), expected = adamw_losses(whole, inputs, kSteps);
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(losses[s], expected[s], 1e-4 * std::abs(expected[s])) << "step " << s;
  EXPECT_LT(losses.back(), losses.front());
}

// Hugging Face Llama with its own causal-LM loss and causal flash attention
// (export_context_parallel_models.py: grouped-query, 4 heads over 2 KV heads), its input ids and labels
// Shard(1) over "cp", on cp x tp its weights placed by the model's own tensor-parallel plan as
// transformers writes it: one step equals PyTorch's eager model (loss and every gradient), and 5 AdamW
// steps follow the whole program in one process. The labels' shift (constant_pad_nd then a slice of the
// sequence) and the rotary tables (computed from arange over the whole sequence) are the model's own.
TEST_P(GraphSpmdContextParallel, HuggingFaceLlamaTrainsLikeItsEagerModel) {
  const SequenceLayout& layout = GetParam();
  const MeshPtr m = mesh(layout.mesh_shape, {}, layout.dims);
  const std::string archive = graph_model("cp/llama_causal_joint.pt2");
  const auto io = tensor_map("cp/llama_causal_joint_io");
  const std::vector<c10::IValue> inputs = {io.at("input0"), io.at("input1")};
  const auto expand = [&] {
    g::Program whole = g::load_program(archive);
    g::SpmdPlacements where;
    Placements sequence(m->ndim(), Replicate());
    sequence[m->dim_index("cp")] = Shard(1);
    where.user_inputs.assign(whole.user_inputs().size(), sequence);
    if (m->ndim() == 2)
      where.state = g::plan_placements(whole, *m, g::hugging_face_plan(graph_model_text("hf/llama_tp_plan.json"), "", "llama_tp_plan.json"),
                                       {.tp_dim = "tp"});
    // At 16 positions and a batch of 4 the cost model would rather exchange the sequence for the batch
    // over cp (data parallelism, not context parallelism).
    return g::spmd_expand(std::move(whole), m, where, {.context_parallel_dim = "cp"});
  };
  g::Program step = expand();
  const auto local_inputs = g::local_user_inputs(step, inputs);
  expect_saves(step, "spmd_joint_llama_causal_" + layout.name, local_inputs);
  expect_joint_step_matches(step, local_inputs, io, m);
  const auto [attention, own] = attention_on_own_queries(step, io.at("input0").size(1));
  EXPECT_GE(attention, 2 * 2);  // two layers, each a forward and a backward
  EXPECT_EQ(own, attention);

  constexpr int kSteps = 5;
  g::Program fresh = expand(), whole = g::load_program(archive);
  const std::vector<double> losses = adamw_losses(fresh, local_inputs, kSteps), expected = adamw_losses(whole, inputs, kSteps);
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(losses[s], expected[s], 1e-4 * std::abs(expected[s])) << "step " << s;
  EXPECT_LT(losses.back(), losses.front());
}

// Sequence parallelism composes with context parallelism: Llama's loss program (core ATen, module
// paths kept) on cp x tp with its norms sequence_parallel holds each norm's values sharded along the
// sequence over both dims (over cp as every activation, over tp by the plan), attention on the
// sequence shards, and computes PyTorch's loss.
class GraphSequenceAndContextParallel : public DistTest {};

TEST_F(GraphSequenceAndContextParallel, LlamaLossWithSequenceParallelNormsOnCpTimesTp) {
  const MeshPtr m = mesh({2, 2}, {}, {"cp", "tp"});
  const auto io = tensor_map("cp/llama_causal_joint_io");
  g::Program whole = g::load_program(graph_model("cp/llama_causal_loss_aten.pt2"));
  const ParallelizePlan plan =
      with_sequence_parallel_norms(g::hugging_face_plan(graph_model_text("hf/llama_tp_plan.json"), "", "llama_tp_plan.json"));
  g::SpmdPlacements where;
  where.user_inputs.assign(2, Placements{Shard(1), Replicate()});
  where.state = g::plan_placements(whole, *m, plan, {.tp_dim = "tp"});
  where.sequence_sharded = g::plan_sequence_parallel(whole, *m, plan, {.tp_dim = "tp"});
  where.outputs = {{0, Placements(2, Replicate())}};
  g::Program step = g::spmd_expand(std::move(whole), m, where, {.context_parallel_dim = "cp"});
  const at::Tensor loss = g::run(step, g::local_user_inputs(step, {io.at("input0"), io.at("input1")}))[0].toTensor();
  EXPECT_TRUE(tensors_close(loss, io.at("loss"), 1e-5, 1e-6));
  for (const size_t dim : {0, 1}) {
    const auto [outputs, sharded] = norm_outputs_on_sequence_shards(step, dim);
    EXPECT_GT(outputs, 0);
    EXPECT_EQ(sharded, outputs) << "mesh dim " << dim << "\n" << step.str();
  }
  const auto [attention, own] = attention_on_own_queries(step, io.at("input0").size(1));
  EXPECT_GT(attention, 0);
  EXPECT_EQ(own, attention);
}

INSTANTIATE_TEST_SUITE_P(Layouts, GraphSpmdContextParallel,
                         ::testing::Values(SequenceLayout{"cp4", {4}, {"cp"}}, SequenceLayout{"cp2tp2", {2, 2}, {"cp", "tp"}}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace dtensor::testing
