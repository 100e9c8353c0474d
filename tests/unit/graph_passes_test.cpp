// Golden tests of the graph passes (src/graph/pipeline.h) and of the strategy search, on small
// hand-built graphs, in one process: a planning-only mesh (MeshOptions::planning_only) lays out the
// ranks, and the program is the one rank 3 of 4 would run. Each pass's result is the printer's text,
// compared whole with what is written here, so that any change in what a pass does shows up as a diff
// to read. Group names are written as they are: derived from the mesh (its shape and ranks), they are
// the same in every process, as a compiled per-rank program needs.
//
// To regenerate after an intended change: DTENSOR_GOLDEN_PRINT=1 ./tests/dtensor_unit_tests
// --gtest_filter='GraphPassesTest.*' prints every pass's text; read it before pasting it in.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gmock/gmock.h>

#include <cstdlib>
#include <iostream>
#include <regex>

#include "../../src/graph/pipeline.h"
#include "../../src/graph/process_groups.h"
#include "../../src/graph/reshard.h"
#include "dtensor/graph/program.h"
#include "dtensor/world.h"

namespace dtensor::testing {
namespace {

namespace g = dtensor::graph;
using g::Arg;

// A mesh of `shape` as rank `rank` of a world of that many ranks sees it, without process groups.
MeshPtr planning_mesh(const Shape& shape, int rank, std::vector<std::string> names = {}) {
  auto world = std::make_shared<World>(c10::make_intrusive<c10d::HashStore>(), rank, static_cast<int>(numel(shape)));
  return DeviceMesh::create(world, shape, {.dim_names = std::move(names), .planning_only = true});
}

// Builds a program node by node, metas inferred from the inputs'.
struct ProgramBuilder {
  g::Program program;

  g::Value* input(const std::string& name, const Shape& shape, g::InputSpec::Kind kind = g::InputSpec::Kind::UserInput) {
    g::Value* v = program.graph.add_input(name);
    v->meta = TensorMeta{shape, contiguous_strides(shape), at::kFloat};
    const bool state = kind != g::InputSpec::Kind::UserInput;
    program.inputs.push_back({kind, v, state ? name : ""});
    if (state) program.state.emplace(name, g::StateTensor(at::arange(numel(shape), at::kFloat).view(shape)));
    return v;
  }
  g::Value* parameter(const std::string& name, const Shape& shape) { return input(name, shape, g::InputSpec::Kind::Parameter); }
  g::Value* op(const std::string& qualified, std::vector<Arg> args, const std::string& name) {
    g::Node* n = program.graph.insert(nullptr, qualified, std::move(args), name);
    g::detail::infer_local_metas(*n);
    return n->outputs[0];
  }
  void output(g::Value* v) {
    program.graph.outputs().push_back(Arg::tensor(v));
    program.outputs.push_back({g::OutputSpec::Kind::UserOutput, ""});
  }
};

// The text of the program after each pass.
std::map<std::string, std::string> run_passes(g::Program& program, const MeshPtr& mesh, const g::detail::MarkOptions& options,
                                             g::StrategyCosts* costs = nullptr) {
  std::map<std::string, std::string> after;
  g::detail::SpmdExpansion expansion{mesh, options};
  g::detail::spmd_pipeline(expansion).run(program, [&](const std::string& pass, const g::Program& p) {
    after[pass] = p.str();
  });
  if (costs) *costs = expansion.marks.costs;
  if (std::getenv("DTENSOR_GOLDEN_PRINT"))
    for (const auto& [pass, text] : after) std::cout << "---- after " << pass << "\n" << text;
  return after;
}

// An MLP with two heads, Megatron's plan: fc1 column-parallel (10 hidden features over 4 ranks: rank
// 3 holds 1), both heads row-parallel, each head's output all-reduced (one bucket).
g::Program two_head_mlp() {
  ProgramBuilder b;
  g::Value* w1 = b.parameter("fc1_weight", {10, 6});
  g::Value* w2 = b.parameter("head1_weight", {6, 10});
  g::Value* w3 = b.parameter("head2_weight", {4, 10});
  g::Value* x = b.input("x", {8, 6});
  g::Value* h = b.op("aten::relu", {Arg::tensor(b.op("aten::linear", {Arg::tensor(x), Arg::tensor(w1)}, "fc1"))}, "relu");
  b.output(b.op("aten::linear", {Arg::tensor(h), Arg::tensor(w2)}, "head1"));
  b.output(b.op("aten::linear", {Arg::tensor(h), Arg::tensor(w3)}, "head2"));
  b.program.annotations.set_placements(*w1, Placements{Shard(0)});
  b.program.annotations.set_placements(*w2, Placements{Shard(1)});
  b.program.annotations.set_placements(*w3, Placements{Shard(1)});
  b.program.annotations.set_placements(*x, Placements{Replicate()});
  return std::move(b.program);
}

TEST(GraphPassesTest, MarkPartitionBucketAndShardStateOnAMegatronMlp) {
  g::Program program = two_head_mlp();
  const at::Tensor fc1 = program.state.at("fc1_weight").tensor();
  const auto after = run_passes(program, planning_mesh({4}, 3), {.keep_state_in_place = true, .only_mesh_dim = 0});
  // Nothing to lift: the graph as built.
  EXPECT_EQ(after.at("lift_batch_matmuls"), R"(%fc1_weight : input [10, 6]  [S(0)]
%head1_weight : input [6, 10]  [S(1)]
%head2_weight : input [4, 10]  [S(1)]
%x : input [8, 6]  [R]
%fc1 = aten::linear(%x, %fc1_weight)  [8, 10]
%relu = aten::relu(%fc1)  [8, 10]
%head1 = aten::linear(%relu, %head1_weight)  [8, 6]
%head2 = aten::linear(%relu, %head2_weight)  [8, 4]
return (%head1, %head2)
)");
  // Column-parallel fc1 leaves its features sharded through relu; the row-parallel heads leave
  // Partial sums.
  EXPECT_EQ(after.at("solve"), R"(%fc1_weight : input [10, 6]  [S(0)]
%head1_weight : input [6, 10]  [S(1)]
%head2_weight : input [4, 10]  [S(1)]
%x : input [8, 6]  [R]
%fc1 = aten::linear(%x, %fc1_weight)  [8, 10] S(1)
%relu = aten::relu(%fc1)  [8, 10] S(1)
%head1 = aten::linear(%relu, %head1_weight)  [8, 6] P(sum)
%head2 = aten::linear(%relu, %head2_weight)  [8, 4] P(sum)
return (%head1, %head2)
)");
  // Rank 3's shapes (10 features over 4 ranks: 3, 3, 3, 1), and each output all-reduced.
  const std::string rank3 = R"(%fc1_weight : input [1, 6]  [S(0)]
%head1_weight : input [6, 1]  [S(1)]
%head2_weight : input [4, 1]  [S(1)]
%x : input [8, 6]  [R]
%fc1 = aten::linear(%x, %fc1_weight)  [8, 1] S(1)
%relu = aten::relu(%fc1)  [8, 1] S(1)
%head1 = aten::linear(%relu, %head1_weight)  [8, 6] P(sum)
%head2 = aten::linear(%relu, %head2_weight)  [8, 4] P(sum)
)";
  EXPECT_EQ(after.at("partition"), rank3 + R"(%all_reduce = _c10d_functional::all_reduce(%head1, sum, dtensor_mesh4_9dbcdbef_dim0)  [8, 6]  # graph output 0: P(sum) -> R; all-reduce on dim 0 (288 B/rank)
%wait_all_reduce = _c10d_functional::wait_tensor(%all_reduce)  [8, 6] R  # graph output 0: P(sum) -> R
%all_reduce_1 = _c10d_functional::all_reduce(%head2, sum, dtensor_mesh4_9dbcdbef_dim0)  [8, 4]  # graph output 1: P(sum) -> R; all-reduce on dim 0 (192 B/rank)
%wait_all_reduce_1 = _c10d_functional::wait_tensor(%all_reduce_1)  [8, 4] R  # graph output 1: P(sum) -> R
return (%wait_all_reduce, %wait_all_reduce_1)
)");
  // The two output all-reduces, one collective over the flattened pieces.
  const std::string bucketed = rank3 + R"(%head1_flat = aten::reshape(%head1, [-1])  [48]
%head2_flat = aten::reshape(%head2, [-1])  [32]
%bucket = aten::cat([%head1_flat, %head2_flat], 0)  [80]
%bucket_all_reduce = _c10d_functional::all_reduce(%bucket, sum, dtensor_mesh4_9dbcdbef_dim0)  [80]  # bucket of 2 all-reduces: graph output 0: P(sum) -> R, graph output 1: P(sum) -> R
%wait_bucket = _c10d_functional::wait_tensor(%bucket_all_reduce)  [80]  # bucket of 2 all-reduces: graph output 0: P(sum) -> R, graph output 1: P(sum) -> R
%wait_all_reduce_piece = aten::slice.Tensor(%wait_bucket, 0, 0, 48)  [48]
%wait_all_reduce_bucketed = aten::view(%wait_all_reduce_piece, [8, 6])  [8, 6] R
%wait_all_reduce_1_piece = aten::slice.Tensor(%wait_bucket, 0, 48, 80)  [32]
%wait_all_reduce_1_bucketed = aten::view(%wait_all_reduce_1_piece, [8, 4])  [8, 4] R
return (%wait_all_reduce_bucketed, %wait_all_reduce_1_bucketed)
)";
  EXPECT_EQ(after.at("bucket"), bucketed);
  // shard_state changes no node: the state now holds rank 3's part (fc1's last row).
  EXPECT_EQ(after.at("shard_state"), bucketed);
  EXPECT_TRUE(at::equal(program.state.at("fc1_weight").tensor(), fc1.slice(0, 9, 10)));
  EXPECT_EQ(program.state.at("head2_weight").tensor().sizes(), (at::IntArrayRef{4, 1}));
}

// Attention scores as core ATen writes them: batch and heads merged for a bmm, split again after.
// Heads sharded (3 over 2 ranks: rank 1 holds 1): the lift makes the 4-d matmul that keeps them.
TEST(GraphPassesTest, LiftBatchMatmulsKeepsHeadsSharded) {
  ProgramBuilder b;
  g::Value* q = b.input("q", {2, 3, 4, 5});
  g::Value* k = b.input("k", {2, 3, 5, 4});
  g::Value* qv = b.op("aten::view", {Arg::tensor(q), Arg::ints({6, 4, 5})}, "q_merged");
  g::Value* kv = b.op("aten::view", {Arg::tensor(k), Arg::ints({6, 5, 4})}, "k_merged");
  g::Value* scores = b.op("aten::bmm", {Arg::tensor(qv), Arg::tensor(kv)}, "scores");
  b.output(b.op("aten::view", {Arg::tensor(scores), Arg::ints({2, 3, 4, 4})}, "scores_split"));
  b.program.annotations.set_placements(*q, Placements{Shard(1)});
  b.program.annotations.set_placements(*k, Placements{Shard(1)});
  const auto after = run_passes(b.program, planning_mesh({2}, 1), {.output_targets = {Placements{Shard(1)}}});
  // The views that merged and split batch and heads are gone with the bmm.
  EXPECT_EQ(after.at("lift_batch_matmuls"), R"(%q : input [2, 3, 4, 5]  [S(1)]
%k : input [2, 3, 5, 4]  [S(1)]
%scores_4d = aten::matmul(%q, %k)  [2, 3, 4, 4]
return (%scores_4d)
)");
  // Rank 1's one head, no collective.
  EXPECT_EQ(after.at("partition"), R"(%q : input [2, 1, 4, 5]  [S(1)]
%k : input [2, 1, 5, 4]  [S(1)]
%scores_4d = aten::matmul(%q, %k)  [2, 1, 4, 4] S(1)
return (%scores_4d)
)");
}

// The strategy search on a stack of Megatron blocks with a nonlinearity after the row-parallel layer:
// node by node (as eager dispatch), its Partial output is reduce-scattered (cheaper than an
// all-reduce) and gathered again for the next column-parallel layer; the local search sees that one
// all-reduce costs less, and the exact search proves it the cheapest.
TEST(GraphPassesTest, SearchReducesWhereNodeByNodeScattersAndGathers) {
  auto build = [] {
    ProgramBuilder b;
    g::Value* w1 = b.parameter("w1", {8, 6});
    g::Value* w2 = b.parameter("w2", {6, 8});
    g::Value* w3 = b.parameter("w3", {8, 6});
    g::Value* x = b.input("x", {8, 6});
    g::Value* h = b.op("aten::relu", {Arg::tensor(b.op("aten::linear", {Arg::tensor(x), Arg::tensor(w1)}, "fc1"))}, "relu1");
    g::Value* y = b.op("aten::relu", {Arg::tensor(b.op("aten::linear", {Arg::tensor(h), Arg::tensor(w2)}, "fc2"))}, "relu2");
    b.output(b.op("aten::linear", {Arg::tensor(y), Arg::tensor(w3)}, "fc3"));
    b.program.annotations.set_placements(*w1, Placements{Shard(0)});
    b.program.annotations.set_placements(*w3, Placements{Shard(0)});
    b.program.annotations.set_placements(*w2, Placements{Shard(1)});
    b.program.annotations.set_placements(*x, Placements{Replicate()});
    return std::move(b.program);
  };
  using Search = g::detail::MarkOptions::Search;
  std::map<Search, std::string> marked;
  std::map<Search, g::StrategyCosts> costs;
  for (const Search search : {Search::Greedy, Search::LocalSearch, Search::Exact}) {
    g::Program program = build();
    marked[search] = run_passes(program, planning_mesh({4}, 0), {.keep_state_in_place = true, .search = search}, &costs[search]).at("partition");
  }
  const std::string head = R"(%w1 : input [2, 6]  [S(0)]
%w2 : input [6, 2]  [S(1)]
%w3 : input [2, 6]  [S(0)]
%x : input [8, 6]  [R]
%fc1 = aten::linear(%x, %w1)  [8, 2] S(1)
%relu1 = aten::relu(%fc1)  [8, 2] S(1)
%fc2 = aten::linear(%relu1, %w2)  [8, 6] P(sum)
)";
  const std::string gathered_output = R"(%rows_first = aten::permute(%fc3, [1, 0])  [2, 8]  # graph output 0: S(1) -> R
%contiguous = aten::clone(%rows_first, 0)  [2, 8]  # graph output 0: S(1) -> R
%all_gather{N} = _c10d_functional::all_gather_into_tensor(%contiguous, 4, dtensor_mesh4_9dbcdbef_dim0)  [8, 8]  # graph output 0: S(1) -> R; all-gather on dim 0 (192 B/rank)
%wait_all_gather{N} = _c10d_functional::wait_tensor(%all_gather{N})  [8, 8]  # graph output 0: S(1) -> R
%rows_back = aten::permute(%wait_all_gather{N}, [1, 0])  [8, 8]  # graph output 0: S(1) -> R
%contiguous_1 = aten::clone(%rows_back, 0)  [8, 8] R  # graph output 0: S(1) -> R
return (%contiguous_1)
)";
  auto numbered = [&](const std::string& suffix) { return std::regex_replace(gathered_output, std::regex("\\{N\\}"), suffix); };
  EXPECT_EQ(marked[Search::Greedy], head + R"(%reduce_scatter = _c10d_functional::reduce_scatter_tensor(%fc2, sum, 4, dtensor_mesh4_9dbcdbef_dim0)  [2, 6]  # for relu2: P(sum) -> S(0); reduce-scatter on dim 0 (144 B/rank)
%wait_reduce_scatter = _c10d_functional::wait_tensor(%reduce_scatter)  [2, 6] S(0)  # for relu2: P(sum) -> S(0)
%relu2 = aten::relu(%wait_reduce_scatter)  [2, 6] S(0)
%all_gather = _c10d_functional::all_gather_into_tensor(%relu2, 4, dtensor_mesh4_9dbcdbef_dim0)  [8, 6]  # for fc3: S(0) -> R; all-gather on dim 0 (144 B/rank)
%wait_all_gather = _c10d_functional::wait_tensor(%all_gather)  [8, 6] R  # for fc3: S(0) -> R
%fc3 = aten::linear(%wait_all_gather, %w3)  [8, 2] S(1)
)" + numbered("_1"));
  EXPECT_EQ(marked[Search::LocalSearch], head + R"(%all_reduce = _c10d_functional::all_reduce(%fc2, sum, dtensor_mesh4_9dbcdbef_dim0)  [8, 6]  # for relu2: P(sum) -> R; all-reduce on dim 0 (288 B/rank)
%wait_all_reduce = _c10d_functional::wait_tensor(%all_reduce)  [8, 6] R  # for relu2: P(sum) -> R
%relu2 = aten::relu(%wait_all_reduce)  [8, 6] R
%fc3 = aten::linear(%relu2, %w3)  [8, 2] S(1)
)" + numbered(""));
  EXPECT_EQ(marked[Search::Exact], marked[Search::LocalSearch]);
  EXPECT_EQ(costs[Search::Greedy].method, "greedy");
  EXPECT_EQ(costs[Search::Exact].method, "exact");
  EXPECT_LT(costs[Search::LocalSearch].chosen, costs[Search::Greedy].chosen);
  EXPECT_EQ(costs[Search::Exact].chosen, costs[Search::LocalSearch].chosen);
}

// A per-rank program's collectives name their groups by what the mesh is: another mesh made before
// changes nothing, and meshes that differ in shape or ranks get other names.
TEST(GraphPassesTest, GroupNamesComeFromTheMeshNotFromTheOrderMeshesWereMade) {
  const MeshPtr first = planning_mesh({2, 2}, 1, {"dp", "tp"});
  const MeshPtr other = planning_mesh({4}, 1);
  const MeshPtr again = planning_mesh({2, 2}, 1, {"dp", "tp"});
  EXPECT_NE(first->id(), again->id());
  EXPECT_EQ(g::detail::group_name(*first, 1), g::detail::group_name(*again, 1));
  EXPECT_THAT(g::detail::group_name(*first, 1), ::testing::MatchesRegex("dtensor_mesh2x2_[0-9a-f]{8}_tp"));
  EXPECT_NE(g::detail::group_name(*first, 0), g::detail::group_name(*first, 1));
  EXPECT_NE(g::detail::group_name(*other, 0), g::detail::group_name(*first, 0));
}

}  // namespace
}  // namespace dtensor::testing
