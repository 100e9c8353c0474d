// Golden tests of the graph passes (src/graph/pipeline.h) and of the strategy search, on small
// hand-built graphs, in one process: a planning-only mesh (MeshOptions::planning_only) lays out the
// ranks, and the program is the one a given rank would run. After each pass the printer's text is
// compared whole with its golden file, tests/goldens/<pass>/<case>.txt, so that any change in what a
// pass does shows up as a diff to read. Group names are written as they are: derived from the mesh
// (its shape and ranks), they are the same in every process, as a compiled per-rank program needs.
//
// To regenerate after an intended change: ./tests/dtensor_unit_tests --gtest_filter='GraphPassesTest.*'
// --update-goldens, then read `git diff tests/goldens` before committing.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gmock/gmock.h>


#include "../../src/graph/pipeline.h"
#include "../../src/graph/process_groups.h"
#include "../../src/graph/reshard.h"
#include "../support/error_of.h"
#include "dtensor/random.h"
#include "goldens.h"
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
    program.graph.add_output(Arg::tensor(v));
    program.outputs.push_back({g::OutputSpec::Kind::UserOutput, ""});
  }
};

// Runs the SPMD pipeline on `program` and compares the program after each pass with its golden file,
// tests/goldens/<pass>/<name>.txt; returns the texts by pass.
std::map<std::string, std::string> run_passes(const std::string& name, g::Program& program, const MeshPtr& mesh,
                                             const g::detail::MarkOptions& options, g::StrategyCosts* costs = nullptr) {
  std::map<std::string, std::string> after;
  g::detail::SpmdExpansion expansion{mesh, options};
  g::detail::spmd_pipeline(expansion).run(program, [&](const std::string& pass, const g::Program& p) {
    after[pass] = p.str();
    EXPECT_TRUE(matches_golden(pass + "/" + name + ".txt", after[pass]));
  });
  if (costs) *costs = expansion.marks.costs;
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
  const auto after = run_passes("megatron_mlp_rank3", program, planning_mesh({4}, 3), {.keep_state_in_place = true, .only_mesh_dim = 0});
  // The goldens (tests/goldens/<pass>/megatron_mlp_rank3.txt) show: nothing to lift; column-parallel
  // fc1 leaves its features sharded through relu, the row-parallel heads Partial sums (solve); rank 3's
  // shapes (10 features over 4 ranks: 3, 3, 3, 1) and each output all-reduced (partition); the two
  // all-reduces one collective over the flattened pieces (bucket); shard_state changes no node.
  EXPECT_EQ(after.at("shard_state"), after.at("bucket"));
  // The state now holds rank 3's part (fc1's last row).
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
  const auto after = run_passes("attention_scores_rank1", b.program, planning_mesh({2}, 1), {.output_targets = {Placements{Shard(1)}}});
  // The views that merged and split batch and heads are gone with the bmm (lift_batch_matmuls), and
  // rank 1 computes its one head without a collective (partition).
  EXPECT_THAT(after.at("lift_batch_matmuls"), ::testing::HasSubstr("%scores_4d = aten::matmul(%q, %k)  [2, 3, 4, 4]"));
  EXPECT_THAT(after.at("partition"), ::testing::Not(::testing::HasSubstr("_c10d_functional")));
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
    const std::string name = search == Search::Greedy ? "greedy" : search == Search::LocalSearch ? "local_search" : "exact";
    marked[search] = run_passes("megatron_blocks_" + name + "_rank0", program, planning_mesh({4}, 0), {.keep_state_in_place = true, .search = search}, &costs[search]).at("partition");
  }
  // tests/goldens/partition/megatron_blocks_*_rank0.txt: node by node reduce-scatters fc2's Partial
  // output for relu2 and all-gathers it for fc3; the local and exact searches all-reduce it once.
  EXPECT_THAT(marked[Search::Greedy], ::testing::HasSubstr("%relu2 = aten::relu(%wait_reduce_scatter)"));
  EXPECT_THAT(marked[Search::LocalSearch], ::testing::HasSubstr("%relu2 = aten::relu(%wait_all_reduce)"));
  EXPECT_EQ(marked[Search::Exact], marked[Search::LocalSearch]);
  EXPECT_EQ(costs[Search::Greedy].method, "greedy");
  EXPECT_EQ(costs[Search::Exact].method, "exact");
  EXPECT_LT(costs[Search::LocalSearch].chosen, costs[Search::Greedy].chosen);
  EXPECT_EQ(costs[Search::Exact].chosen, costs[Search::LocalSearch].chosen);
}

// A local kernel's graph form replaces its node: histc over the data's range (min == max) on a sharded
// input needs the whole tensor for the Scalars histc takes, so its form puts the shards together
// (padded, all-reduced), counts, and keeps the counts on the first rank only (a Partial sum). The
// program saves.
TEST(GraphPassesTest, HistcOverTheDataRangeIsWrittenAsItsGraphForm) {
  ProgramBuilder b;
  g::Value* x = b.input("x", {8});
  b.output(b.op("aten::histc", {Arg::tensor(x), Arg::of(int64_t{4})}, "counts"));
  b.program.annotations.set_placements(*x, Placements{Shard(0)});
  // Node by node, as eager dispatch would, and the counts left as partial sums: the shards stay.
  using Search = g::detail::MarkOptions::Search;
  const auto after = run_passes("histc_rank0", b.program, planning_mesh({4}, 0),
                                {.search = Search::Greedy, .output_targets = {Placements{Partial()}}});
  EXPECT_THAT(after.at("partition"), ::testing::Not(::testing::HasSubstr("runs dtensor's local kernel")));
  for (const g::Node* n : b.program.graph.nodes()) EXPECT_EQ(b.program.annotations.local_kernel(*n), nullptr) << n->name;
  EXPECT_NO_THROW(g::save_program(b.program, ::testing::TempDir() + "histc_rank0.pt2"));
}

// A kernel without a graph form stays with its node, in the program's annotations (not on the node):
// the interpreter runs it, and saving refuses the program, naming the node. (A random draw on a
// sharded tensor in the LocalShards mode: each rank draws its part from a counter-based generator,
// which no ATen op is.)
TEST(GraphPassesTest, AKernelWithoutAGraphFormStaysAndTheProgramRefusesToSave) {
  const RandomModeGuard local_shards(RandomMode::LocalShards);
  ProgramBuilder b;
  g::Value* x = b.input("x", {8});
  b.output(b.op("aten::rand_like", {Arg::tensor(x)}, "noise"));
  b.program.annotations.set_placements(*x, Placements{Shard(0)});
  g::detail::SpmdExpansion expansion{planning_mesh({4}, 0), {.output_targets = {Placements{Shard(0)}}}};
  g::detail::spmd_pipeline(expansion).run(b.program);
  const g::Node* noise = nullptr;
  for (const g::Node* n : b.program.graph.nodes())
    if (n->name == "noise") noise = n;
  ASSERT_NE(noise, nullptr);
  EXPECT_NE(b.program.annotations.local_kernel(*noise), nullptr);
  EXPECT_THAT(b.program.str(), ::testing::HasSubstr("runs dtensor's local kernel"));
  EXPECT_THAT(error_of([&] { g::save_program(b.program, ::testing::TempDir() + "noise_rank0.pt2"); }),
              ::testing::HasSubstr("node 'noise' (aten::rand_like) runs dtensor's local kernel, which has no graph form yet"));
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
  // One dim name on different dims of meshes alike: other members, so another name (a process holding
  // both programs, as PyTorch's runner of the saved ones does, would otherwise send one's collectives
  // to the other's group).
  const MeshPtr dp_ep = planning_mesh({2, 2}, 1, {"dp", "ep"}), ep_tp = planning_mesh({2, 2}, 1, {"ep", "tp"});
  EXPECT_NE(g::detail::group_name(*dp_ep, 1), g::detail::group_name(*ep_tp, 0));
}

}  // namespace
}  // namespace dtensor::testing
