// SPMD expansion (seed 001) on real ranks: the exported GPT's joint forward+backward graph expanded
// for DP, TP and DP x TP trains like the single-process program (AdamW, 10 steps); forward programs
// keep module-level TP's collectives; a dynamic-batch export runs at two batch sizes; the whole-graph
// strategy choice moves fewer bytes than node-by-node; freeing after the last use lowers the peak;
// bad placements get clear errors.

#include <ATen/ATen.h>

#include "../harness.h"
#include "expect_saves.h"
#include "joint_step_matches.h"
#include "adamw_losses.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/spmd.h"
#include "dtensor/graph/training.h"
#include "gpt/graph_plan.h"
#include "../../support/test_models.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;
namespace g = dtensor::graph;

// A layout on 4 ranks: the batch sharded over the mesh dim named "dp", the weights placed by the GPT
// plan over the one named "tp".
struct Layout {
  std::string name;
  Shape mesh_shape;
  std::vector<std::string> dims;

  MeshPtr make() const { return mesh(mesh_shape, {}, dims); }
  bool has(const std::string& dim) const { return std::find(dims.begin(), dims.end(), dim) != dims.end(); }

  g::SpmdPlacements placements(const g::Program& program, const MeshPtr& m) const {
    g::SpmdPlacements where;
    Placements batch(m->ndim(), Replicate());
    if (has("dp")) batch[m->dim_index("dp")] = Shard(0);
    where.user_inputs.assign(program.user_inputs().size(), batch);
    if (has("tp")) where.state = g::plan_placements(program, *m, gpt::graph_plan(true), {.tp_dim = "tp"});
    return where;
  }
};

g::Program expanded_joint_gpt(const Layout& layout, const MeshPtr& m) {
  const std::string path = graph_model("gpt_joint.pt2");
  const g::Program whole = g::load_program(path);
  return g::spmd_expand(g::load_program(path), m, layout.placements(whole, m));
}

class GraphSpmdTraining : public DistTest, public ::testing::WithParamInterface<Layout> {};

// One call of the expanded joint program is a whole training step: its loss and every parameter's
// gradient (this rank's part, averaged over dp in the graph) equal PyTorch's, and 10 AdamW steps on
// the local shards follow the single-process program's losses.
TEST_P(GraphSpmdTraining, JointGptTrainsLikeOneProcess) {
  const Layout& layout = GetParam();
  const MeshPtr m = layout.make();
  const auto io = tensor_map("gpt_joint_io");
  const std::vector<c10::IValue> inputs = {io.at("input0"), io.at("input1")};
  g::Program step = expanded_joint_gpt(layout, m);
  expect_saves(step, "spmd_joint_gpt_" + layout.name, g::local_user_inputs(step, inputs));
  g::Program whole = g::load_program(graph_model("gpt_joint.pt2"));
  const auto local_inputs = g::local_user_inputs(step, inputs);

  expect_joint_step_matches(step, local_inputs, io, m);

  constexpr int kSteps = 10;
  g::Program fresh = expanded_joint_gpt(layout, m);
  const std::vector<double> losses = adamw_losses(fresh, local_inputs, kSteps), expected = adamw_losses(whole, inputs, kSteps);
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(losses[s], expected[s], 1e-4 * std::abs(expected[s])) << "step " << s;
  EXPECT_LT(losses.back(), losses.front());
  // The trained shards are the single-process parameters' parts: AdamW normalises each update, so
  // where a gradient is near zero its rounding shows in the update; half a step (lr / 2) tells a
  // misplaced shard from that.
  for (const g::InputSpec& spec : fresh.inputs)
    if (spec.kind == g::InputSpec::Kind::Parameter)
      EXPECT_TRUE(tensors_close(fresh.state.at(spec.target).tensor(),
                                expected_shard(whole.state.at(spec.target).tensor(), m, fresh.annotations.placements_of(*spec.value)), 0, 5e-3))
          << spec.target;
}

INSTANTIATE_TEST_SUITE_P(Layouts, GraphSpmdTraining,
                         ::testing::Values(Layout{"dp4", {4}, {"dp"}}, Layout{"tp4", {4}, {"tp"}},
                                           Layout{"dp2tp2", {2, 2}, {"dp", "tp"}}),
                         [](const auto& info) { return info.param.name; });

class GraphSpmdTest : public DistTest {};

// Data parallel: the gradients are all-reduced together, in one bucket after the backward (as DDP
// does), besides the one scalar the mean loss divides by (the count of targets).
TEST_F(GraphSpmdTest, SpmdDataParallelAllReducesTheGradientsInOneBucket) {
  const Layout dp{"dp4", {4}, {"dp"}};
  g::Program step = expanded_joint_gpt(dp, dp.make());
  int gradients = 0;
  for (const g::OutputSpec& o : step.outputs) gradients += o.kind == g::OutputSpec::Kind::GradientToParameter;
  EXPECT_EQ(collectives_in(step), (std::map<std::string, int>{{"_c10d_functional::all_reduce", 2}})) << g::collectives_report(step);
  const auto notes = g::collectives(step);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_THAT(notes[1].why, HasSubstr("bucket of " + std::to_string(gradients + 1) + " all-reduces"));  // and the loss
}

// Tensor parallel training step against Megatron's, which all-reduces an activation 1 + 2 per layer
// times forward (embedding, attn.wo, mlp.fc2) and 2 per layer + 1 backward (the input gradients of
// q/k/v, fc1 and the LM head) and nothing else of size. The expanded step runs Megatron's forward
// all-reduces first, receives no more bytes in all than Megatron's 10 all-reduces, never moves more
// than one of them at once (no activation gathered whole), and ends with one gradient bucket.
TEST_F(GraphSpmdTest, SpmdTensorParallelStepMovesNoMoreThanMegatron) {
  const Layout tp{"tp4", {4}, {"tp"}};
  g::Program step = expanded_joint_gpt(tp, tp.make());
  const int64_t activation_all_reduce = 2 * (8 * 32 * 128 * 4) * 3 / 4;  // [batch, seq, dim] float32 over 4 ranks
  const int megatron = 2 * (1 + 2 * kGptLayers);
  const auto notes = g::collectives(step);
  ASSERT_GE(notes.size(), static_cast<size_t>(1 + 2 * kGptLayers)) << g::collectives_report(step);
  int64_t received = 0;
  int buckets = 0;
  for (size_t i = 0; i < notes.size(); ++i) {
    if (i < 1 + 2 * kGptLayers) {
      EXPECT_EQ(notes[i].op, "_c10d_functional::all_reduce") << notes[i].why;
      EXPECT_EQ(notes[i].bytes_per_rank, activation_all_reduce) << notes[i].why;
    }
    EXPECT_LE(notes[i].bytes_per_rank, activation_all_reduce) << notes[i].why;
    received += notes[i].bytes_per_rank;
    buckets += notes[i].why.rfind("bucket of", 0) == 0;
  }
  EXPECT_LE(received, megatron * activation_all_reduce) << g::collectives_report(step);
  EXPECT_EQ(buckets, 1);
  // Node by node (PyTorch's way, on the fused backward kernels its eager autograd runs too) moves
  // nearly twice as much by the model (0.53x; 0.38x against the decomposed backward, whose small ops
  // node by node choice handles worse).
  EXPECT_LT(step.strategy_costs.chosen, 0.55 * step.strategy_costs.node_by_node) << g::collectives_report(step);
}

// Forward TP by expansion from the plan's placements equals module-level TP's collectives (and the
// graph TP transform's), when the logits are asked for Replicate.
TEST_F(GraphSpmdTest, SpmdTensorParallelForwardHasModuleLevelCollectives) {
  const MeshPtr m = mesh({4}, {}, {"tp"});
  const auto io = tensor_map("gpt_train_ir_static_io_b8");
  g::Program whole = g::load_program(graph_model("gpt_train_ir_static.pt2"));
  g::SpmdPlacements where;
  where.state = g::plan_placements(whole, *m, gpt::graph_plan(true));
  where.outputs = {{0, {Replicate()}}};
  g::Program local = g::spmd_expand(std::move(whole), m, where);
  EXPECT_TRUE(tensors_close(g::run(local, {io.at("input0")})[0].toTensor(), io.at("output0"), 1e-4, 1e-5));
  EXPECT_EQ(collectives_in(local), gpt_module_level_collectives()) << g::collectives_report(local);
  // Without asking, the logits stay sharded over the vocabulary (the seed keeps shards): no gather.
  g::SpmdPlacements sharded_logits = where;
  sharded_logits.outputs.clear();
  g::Program kept = g::spmd_expand(g::load_program(graph_model("gpt_train_ir_static.pt2")), m, sharded_logits);
  const at::Tensor logits = g::run(kept, {io.at("input0")})[0].toTensor();
  EXPECT_TRUE(tensors_close(logits, expected_shard(io.at("output0"), m, {Shard(2)}), 1e-4, 1e-5));
  expect_saves(local, "spmd_gpt_forward", {io.at("input0")});
  expect_saves(kept, "spmd_gpt_forward_sharded_logits", {io.at("input0")});
}

// DSymInt: the batch of a dynamic export is read with sym_size and used in views; sharded over dp,
// each rank's views get its local batch, at any batch size that divides, without re-export.
TEST_F(GraphSpmdTest, SpmdDynamicBatchRunsAtTwoSizes) {
  const Layout layout{"dp2tp2", {2, 2}, {"dp", "tp"}};
  const MeshPtr m = layout.make();
  const std::string path = graph_model("gpt_train_ir_dynamic.pt2");
  g::Program whole = g::load_program(path);
  g::SpmdPlacements where = layout.placements(whole, m);
  where.outputs = {{0, {Replicate(), Replicate()}}};
  g::Program local = g::spmd_expand(g::load_program(path), m, where);
  const auto io = tensor_map("gpt_train_ir_dynamic_io_b8");
  EXPECT_TRUE(tensors_close(g::run(local, g::local_user_inputs(local, {io.at("input0")}))[0].toTensor(), io.at("output0"), 1e-4, 1e-5));
  // Batches 6 and 12 (below and above the exported example): the oracle is the whole program in one
  // process.
  for (int64_t batch : {6, 12}) {
    const at::Tensor tokens = at::arange(batch * 32, at::kLong).mul(5).remainder(42).view({batch, 32});
    const at::Tensor expected = g::run(whole, {tokens})[0].toTensor();
    EXPECT_TRUE(tensors_close(g::run(local, g::local_user_inputs(local, {tokens}))[0].toTensor(), expected, 1e-4, 1e-5)) << batch;
  }
  // Batch 3 does not divide over dp = 2.
  expect_saves(local, "spmd_gpt_dynamic_batch", g::local_user_inputs(local, {io.at("input0")}));
  EXPECT_THAT(error_of([&] { g::local_user_inputs(local, {io.at("input0").narrow(0, 0, 3)}); }),
              HasSubstr("user input 0 (%tokens): its dynamic dim 0 (s52) is 3, which 2 shards (S(0),R on"));
}

// DSymInt consumers beyond views: a factory sized by the sharded batch makes this rank's part, and
// arange(batch) gets the global batch (the local one times the shards). Added to the dynamic GPT's
// tokens as zeros (tokens + zeros([B, 32]) + 0 * sum(arange(B))), so its logits stay PyTorch's.
TEST_F(GraphSpmdTest, SpmdFactoriesSizedByAShardedBatch) {
  const Layout layout{"dp2tp2", {2, 2}, {"dp", "tp"}};
  const MeshPtr m = layout.make();
  g::Program program = g::load_program(graph_model("gpt_train_ir_dynamic.pt2"));
  g::Value* tokens = program.user_inputs()[0];
  g::Node* first_use = program.graph.users(tokens).front();
  auto node = [&](const std::string& op, std::vector<g::Arg> args, const std::string& name, Shape shape) {
    g::Node* n = program.graph.insert(first_use, op, std::move(args), name);
    n->outputs[0]->meta = TensorMeta{shape, contiguous_strides(shape), at::kLong};
    return n->outputs[0];
  };
  g::Node* size = program.graph.insert(first_use, "aten::sym_size.int", {g::Arg::tensor(tokens), g::Arg::of(int64_t{0})}, "batch");
  g::Value* batch = size->outputs[0];
  batch->sym_hint = 8;
  g::Arg sizes{g::Arg::Kind::SymInts};
  sizes.sizes = {g::SymSize{0, batch}, g::SymSize{32, nullptr}};
  g::Arg end{g::Arg::Kind::SymInt};
  end.sizes = {g::SymSize{0, batch}};
  g::Value* zeros = node("aten::zeros", {sizes, g::Arg::of(c10::IValue(at::kLong))}, "zeros", {8, 32});
  g::Value* rows = node("aten::arange", {end, g::Arg::of(c10::IValue(at::kLong))}, "rows", {8});
  g::Value* total = node("aten::sum", {g::Arg::tensor(rows)}, "total", {});
  g::Value* none = node("aten::mul.Scalar", {g::Arg::tensor(total), g::Arg::of(c10::Scalar(int64_t{0}))}, "none", {});
  g::Value* shifted = node("aten::add.Tensor", {g::Arg::tensor(tokens), g::Arg::tensor(zeros)}, "shifted", {8, 32});
  g::Value* same = node("aten::add.Tensor", {g::Arg::tensor(shifted), g::Arg::tensor(none)}, "same", {8, 32});
  program.graph.replace_all_uses(tokens, same, nullptr);
  // ... except in the nodes just made, which read the tokens themselves.
  for (g::Node* n : {size, shifted->producer()})
    for (size_t i = 0; i < n->args().size(); ++i) {
      g::Arg a = n->args()[i];
      for (g::Value*& v : a.values)
        if (v == same) v = tokens;
      program.graph.set_arg(n, i, std::move(a));
    }
  g::SpmdPlacements where = layout.placements(program, m);
  where.outputs = {{0, {Replicate(), Replicate()}}};
  g::Program local = g::spmd_expand(std::move(program), m, where);
  const std::string printed = local.str();
  EXPECT_THAT(printed, HasSubstr("makes this rank's part: a size is read from a sharded dim")) << printed;
  EXPECT_THAT(printed, HasSubstr("the global value of a size read from a dim sharded 2 ways")) << printed;
  for (const g::Node* n : local.graph.nodes()) {
    if (n->name == "zeros") EXPECT_EQ(n->outputs[0]->meta.shape, (Shape{4, 32}));  // this rank's rows
    if (n->name == "rows") EXPECT_EQ(n->outputs[0]->meta.shape, (Shape{8}));       // the whole batch
  }
  const auto io = tensor_map("gpt_train_ir_dynamic_io_b8");
  EXPECT_TRUE(tensors_close(g::run(local, g::local_user_inputs(local, {io.at("input0")}))[0].toTensor(), io.at("output0"), 1e-4, 1e-5));
  expect_saves(local, "spmd_gpt_factories", g::local_user_inputs(local, {io.at("input0")}));
  const auto io3 = tensor_map("gpt_train_ir_dynamic_io_b3");
  const at::Tensor six = at::cat({io3.at("input0"), io3.at("input0")});
  const at::Tensor expected = at::cat({io3.at("output0"), io3.at("output0")});
  EXPECT_TRUE(tensors_close(g::run(local, g::local_user_inputs(local, {six}))[0].toTensor(), expected, 1e-4, 1e-5));
}

// Whole-graph choice against node-by-node: with lm_head replicated, node by node all-reduces the last
// residual and runs the head replicated; the whole graph reduce-scatters it over the batch instead
// and gathers the smaller logits (see tensor_parallel_test.cpp).
TEST_F(GraphSpmdTest, SpmdWholeGraphChoiceMovesFewerBytes) {
  const MeshPtr m = mesh({4}, {}, {"tp"});
  const auto io = tensor_map("gpt_train_ir_static_io_b8");
  auto expand = [&](g::SpmdOptions::Search search) {
    g::Program whole = g::load_program(graph_model("gpt_train_ir_static.pt2"));
    g::SpmdPlacements where;
    where.state = g::plan_placements(whole, *m, gpt::graph_plan(false));
    where.outputs = {{0, {Replicate()}}};
    return g::spmd_expand(std::move(whole), m, where, {.search = search});
  };
  g::Program greedy = expand(g::SpmdOptions::Search::Greedy), whole_graph = expand(g::SpmdOptions::Search::Exact);
  auto received = [](const g::Program& p) {
    int64_t bytes = 0;
    for (const g::CollectiveNote& c : g::collectives(p)) bytes += c.bytes_per_rank;
    return bytes;
  };
  const auto& costs = whole_graph.strategy_costs;
  const size_t fewer = g::collectives(greedy).size() - g::collectives(whole_graph).size();
  if (world()->rank() == 0)
    std::cout << "whole-graph choice (" << costs.method << "): modelled cost " << costs.chosen << " vs node by node "
              << costs.node_by_node << " (" << 100 * (1 - costs.chosen / costs.node_by_node) << "% less), " << fewer
              << " fewer collectives; bytes received per rank " << received(whole_graph) << " vs " << received(greedy) << "\n";
  // The model's bytes include a latency per collective (kCollectiveLatencyBytes): the whole graph
  // moves as many payload bytes in 4 fewer collectives (about 6% less by the model).
  EXPECT_EQ(greedy.strategy_costs.chosen, costs.node_by_node);
  EXPECT_LT(costs.chosen, 0.95 * costs.node_by_node);
  EXPECT_EQ(fewer, 4u);
  EXPECT_LE(received(whole_graph), received(greedy));
  for (g::Program* p : {&greedy, &whole_graph})
    EXPECT_TRUE(tensors_close(g::run(*p, {io.at("input0")})[0].toTensor(), io.at("output0"), 1e-4, 1e-5));
}

// The exact search finishes on a small graph, and proves there that nothing beats its choice.
TEST_F(GraphSpmdTest, SpmdExactSearchOnASmallGraph) {
  const MeshPtr m = mesh({4}, {}, {"tp"});
  g::Program whole = g::load_program(graph_model("mlp_head.pt2"));
  g::SpmdPlacements where;
  where.state = g::plan_placements(whole, *m, {{"fc1", ColwiseParallel{}}, {"fc2", RowwiseParallel{}}});
  where.outputs = {{0, {Replicate()}}};
  g::Program local = g::spmd_expand(std::move(whole), m, where);
  EXPECT_EQ(local.strategy_costs.method, "exact");
  EXPECT_LE(local.strategy_costs.chosen, local.strategy_costs.node_by_node);
  const auto io = tensor_map("mlp_head_io");
  EXPECT_TRUE(tensors_close(g::run(local, {io.at("input0")})[0].toTensor(), io.at("output0"), 1e-5, 1e-6));
}

// Freeing every value after its last consumer (the interpreter's default) keeps far fewer
// activation bytes live in the expanded training step.
TEST_F(GraphSpmdTest, SpmdFreeingAfterLastUseLowersThePeak) {
  const Layout layout{"dp2tp2", {2, 2}, {"dp", "tp"}};
  g::Program step = expanded_joint_gpt(layout, layout.make());
  const auto io = tensor_map("gpt_joint_io");
  const auto inputs = g::local_user_inputs(step, {io.at("input0"), io.at("input1")});
  g::RunStats freed, kept;
  g::run(step, inputs, {.free_after_last_use = true}, &freed);
  g::run(step, inputs, {.free_after_last_use = false}, &kept);
  EXPECT_LT(freed.peak_live_bytes, kept.peak_live_bytes / 2) << freed.peak_live_bytes << " vs " << kept.peak_live_bytes;
}

// ---- bad inputs -------------------------------------------------------------------------------

TEST_F(GraphSpmdTest, SpmdRefusesPlacementsThatDoNotFit) {
  const MeshPtr m = mesh({2, 2}, {}, {"dp", "tp"});
  auto expand = [&](const g::SpmdPlacements& where) {
    return error_of([&] { g::spmd_expand(g::load_program(graph_model("gpt_joint.pt2")), m, where); });
  };
  g::SpmdPlacements one_input;
  one_input.user_inputs = {{Shard(0), Replicate()}};
  EXPECT_THAT(expand(one_input), HasSubstr("1 user input placements given, but the program takes 2 user inputs"));
  g::SpmdPlacements short_placements;
  short_placements.user_inputs = {{Shard(0)}, {Shard(0)}};
  EXPECT_THAT(expand(short_placements), HasSubstr("user input 0 (%tokens, shape [8, 32]) on DeviceMesh"));
  EXPECT_THAT(expand(short_placements), HasSubstr("got 1 placement(s) (S(0)) for a mesh with 2 dimension(s)"));
  g::SpmdPlacements unknown;
  unknown.state = {{"blocks.0.attn.wz.weight", {Replicate(), Shard(0)}}};
  EXPECT_THAT(expand(unknown), HasSubstr("'blocks.0.attn.wz.weight', which is not a parameter, buffer or constant of the program"));
  g::SpmdPlacements bad_dim;
  bad_dim.state = {{"ln_f.weight", {Replicate(), Shard(1)}}};
  EXPECT_THAT(expand(bad_dim), HasSubstr("'ln_f.weight'"));
  g::SpmdPlacements partial_input;
  partial_input.user_inputs = {{Partial(ReduceOp::Sum), Replicate()}, {Replicate(), Replicate()}};
  EXPECT_THAT(expand(partial_input), HasSubstr("user inputs are Shard or Replicate"));
  g::SpmdPlacements head_tail;  // no graph form yet: refused rather than taken for plain blocks
  head_tail.user_inputs = {{Replicate(), HeadTailShard(1)}, {Replicate(), HeadTailShard(1)}};
  EXPECT_THAT(expand(head_tail), HasSubstr("HT(1): graph programs have no form of head-tail shards yet"));
}

TEST_F(GraphSpmdTest, SpmdRefusesAJointGraphWithoutLoss) {
  g::Program joint = g::load_program(graph_model("gpt_joint.pt2"));
  for (g::OutputSpec& o : joint.outputs)
    if (o.kind == g::OutputSpec::Kind::LossOutput) o.kind = g::OutputSpec::Kind::UserOutput;
  EXPECT_THAT(error_of([&] { g::spmd_expand(std::move(joint), mesh({4}, {}, {"dp"}), {}); }),
              HasSubstr("is a joint graph (it outputs gradients) without a LOSS_OUTPUT"));
}

// A sharded value reaching an op without a sharding rule is an error naming the node, never a
// silent gather.
TEST_F(GraphSpmdTest, SpmdRefusesAShardedInputToAnOpWithoutRule) {
  g::Program mlp = g::load_program(graph_model("mlp.pt2"));
  g::Node* fc1 = nullptr;
  for (g::Node* n : mlp.graph.nodes())
    if (n->module_path == "fc1") fc1 = n;
  ASSERT_NE(fc1, nullptr);
  g::Value* hidden = fc1->outputs[0];
  g::Node* scan = mlp.graph.insert_after(fc1, "aten::_conj", {g::Arg::tensor(hidden)}, "scan");
  scan->outputs[0]->meta = hidden->meta;
  mlp.graph.replace_all_uses(hidden, scan->outputs[0], scan);
  const MeshPtr m = mesh({4}, {}, {"tp"});
  g::SpmdPlacements where;
  where.state = g::plan_placements(mlp, *m, {{"fc1", ColwiseParallel{}}, {"fc2", RowwiseParallel{}}});
  EXPECT_THAT(error_of([&] { g::spmd_expand(std::move(mlp), m, where); }),
              HasSubstr("node 'scan' (aten::_conj) has no sharding rule, and inputs placed (S(1)) reach it"));
}

}  // namespace
}  // namespace dtensor::testing
