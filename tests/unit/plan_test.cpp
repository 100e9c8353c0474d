// The redistribution planner: which steps it picks (checked against hand-derived plans), what it
// says they cost, how it prints them, and, over random meshes and placements, that its steps form a
// valid walk from src to dst that every rank agrees on.

#include "unit_helpers.h"
#include "dtensor/redistribute_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dtensor/errors.h"

namespace dtensor {
namespace {

using dtensor::unit::all_coordinates;

constexpr int64_t kFloat = 4;  // bytes per element

// One line per step, "mesh dim: from->to kind", so a whole plan compares (and prints) as a list.
std::vector<std::string> step_lines(const RedistributePlan& plan) {
  std::vector<std::string> out;
  for (const auto& s : plan.steps)
    out.push_back(std::to_string(s.mesh_dim) + ": " + s.from.str() + "->" + s.to.str() + " " + to_string(s.kind));
  return out;
}

using Lines = std::vector<std::string>;

RedistributePlan plan_1d(const Shape& global, int64_t ranks, const Placement& src, const Placement& dst,
                         int64_t coord = 0, int64_t element_size = kFloat) {
  return plan_redistribute(global, element_size, {ranks}, {coord}, {src}, {dst});
}

// ---- Every transition on a 1-d mesh ---------------------------------------------------------------
// [8, 4] floats (128 bytes) over 4 ranks unless said otherwise: every chunk is full, so each rank
// receives 3/4 of what the collective assembles.

TEST(Plan1d, ShardToReplicateIsAnAllGather) {
  const auto plan = plan_1d({8, 4}, 4, Shard(0), Replicate());
  EXPECT_EQ(step_lines(plan), (Lines{"0: S(0)->R all-gather"}));
  EXPECT_EQ(plan.steps[0].logical_shape, (Shape{8, 4}));
  EXPECT_EQ(plan.steps[0].bytes_per_rank, 96);  // 3 of 4 chunks of 128 bytes
  EXPECT_TRUE(plan.needs_communication());
  EXPECT_EQ(plan.total_bytes_per_rank(), 96);
}

TEST(Plan1d, ReplicateToShardIsALocalChunk) {
  const auto plan = plan_1d({8, 4}, 4, Replicate(), Shard(1));
  EXPECT_EQ(step_lines(plan), (Lines{"0: R->S(1) local chunk"}));
  EXPECT_EQ(plan.steps[0].bytes_per_rank, 0);
  EXPECT_FALSE(plan.needs_communication());
  EXPECT_EQ(plan.total_bytes_per_rank(), 0);
}

TEST(Plan1d, PartialToReplicateIsAnAllReduce) {
  const auto plan = plan_1d({8, 4}, 4, Partial(ReduceOp::Max), Replicate());
  EXPECT_EQ(step_lines(plan), (Lines{"0: P(max)->R all-reduce"}));
  // A ring all-reduce is a reduce-scatter plus an all-gather: 2 * 3/4 * 128.
  EXPECT_EQ(plan.steps[0].bytes_per_rank, 192);
}

TEST(Plan1d, PartialToShardIsAReduceScatter) {
  for (int64_t d : {0, 1}) {
    const auto plan = plan_1d({8, 4}, 4, Partial(), Shard(d));
    EXPECT_EQ(step_lines(plan), (Lines{"0: P(sum)->S(" + std::to_string(d) + ") reduce-scatter"}));
    EXPECT_EQ(plan.steps[0].bytes_per_rank, 96);
  }
}

TEST(Plan1d, ShardToOtherShardIsAnAllToAll) {
  const auto plan = plan_1d({8, 4}, 4, Shard(0), Shard(1));
  EXPECT_EQ(step_lines(plan), (Lines{"0: S(0)->S(1) all-to-all"}));
  // The local [2, 4] block (32 bytes) keeps 1/4 and exchanges the rest.
  EXPECT_EQ(plan.steps[0].bytes_per_rank, 24);
}

TEST(Plan1d, ReplicateToPartialIsALocalPartition) {
  const auto plan = plan_1d({8, 4}, 4, Replicate(), Partial(ReduceOp::Avg));
  EXPECT_EQ(step_lines(plan), (Lines{"0: R->P(avg) local partition"}));
  EXPECT_FALSE(plan.needs_communication());
}

TEST(Plan1d, ShardToPartialSumIsALocalPad) {
  const auto plan = plan_1d({8, 4}, 4, Shard(0), Partial());
  EXPECT_EQ(step_lines(plan), (Lines{"0: S(0)->P(sum) local pad"}));
  EXPECT_FALSE(plan.needs_communication());
}

TEST(Plan1d, ShardToOtherPartialsGoesThroughReplicate) {
  const auto plan = plan_1d({8, 4}, 4, Shard(0), Partial(ReduceOp::Avg));
  EXPECT_EQ(step_lines(plan), (Lines{"0: S(0)->R all-gather", "0: R->P(avg) local partition"}));
  EXPECT_EQ(plan.total_bytes_per_rank(), 96);
}

TEST(Plan1d, PartialToOtherPartialGoesThroughReplicate) {
  const auto plan = plan_1d({8, 4}, 4, Partial(ReduceOp::Sum), Partial(ReduceOp::Max));
  EXPECT_EQ(step_lines(plan), (Lines{"0: P(sum)->R all-reduce", "0: R->P(max) local partition"}));
  EXPECT_EQ(plan.total_bytes_per_rank(), 192);
}

TEST(Plan1d, IdenticalPlacementsNeedNothing) {
  for (const Placement& p : {Shard(0), Shard(1), Replicate(), Partial(), Partial(ReduceOp::Min)}) {
    const auto plan = plan_1d({8, 4}, 4, p, p);
    EXPECT_TRUE(plan.steps.empty()) << plan.str();
    EXPECT_FALSE(plan.needs_communication());
    EXPECT_EQ(plan.total_bytes_per_rank(), 0);
    EXPECT_EQ(plan.str(), p.str() + " -> " + p.str() + ": nothing to do");
  }
}

// ---- Byte counts --------------------------------------------------------------------------------

TEST(PlanBytes, UnevenShardsArePaddedToTheFullChunk) {
  // 5 rows over 4 ranks: chunks 2,2,1,0 padded to 2 rows each, 8 rows * 3 * 4 B = 96 B in all, and
  // every rank (the one with the empty chunk too) receives 3 padded chunks.
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(plan_1d({5, 3}, 4, Shard(0), Replicate(), r).steps[0].bytes_per_rank, 72) << "rank " << r;
    EXPECT_EQ(plan_1d({5, 3}, 4, Partial(), Shard(0), r).steps[0].bytes_per_rank, 72) << "rank " << r;
  }
  // 7 rows over 3: padded to 3 rows each, 9 * 2 * 4 B = 72 B, 2/3 received.
  EXPECT_EQ(plan_1d({7, 2}, 3, Shard(0), Replicate()).steps[0].bytes_per_rank, 48);
  // All-reduce has no chunks to pad: 2 * 3/4 * 60 B.
  EXPECT_EQ(plan_1d({5, 3}, 4, Partial(), Replicate()).steps[0].bytes_per_rank, 90);
}

TEST(PlanBytes, ScaleWithElementSizeAndVanishOnOneRank) {
  EXPECT_EQ(plan_1d({8, 4}, 4, Shard(0), Replicate(), 0, 8).steps[0].bytes_per_rank, 192);
  EXPECT_EQ(plan_1d({8, 4}, 4, Shard(0), Replicate(), 0, 2).steps[0].bytes_per_rank, 48);
  // A one-rank group has nobody to receive from.
  EXPECT_EQ(plan_1d({8, 4}, 1, Shard(0), Replicate()).steps[0].bytes_per_rank, 0);
  EXPECT_EQ(plan_1d({8, 4}, 1, Partial(), Replicate()).steps[0].bytes_per_rank, 0);
}

// ---- Printing -----------------------------------------------------------------------------------

TEST(PlanFormat, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(96), "96 B");
  EXPECT_EQ(format_bytes(999), "999 B");
  EXPECT_EQ(format_bytes(1000), "1.0 kB");  // decimal units
  EXPECT_EQ(format_bytes(1536), "1.5 kB");
  EXPECT_EQ(format_bytes(3.1e6), "3.1 MB");
  EXPECT_EQ(format_bytes(2.5e9), "2.50 GB");
}

TEST(PlanFormat, StepsNameTheirMeshDimAndBytesOnlyForCollectives) {
  // 1024 x 1024 floats is 4 MiB; 3/4 of it is 3145728 B.
  const auto gather = plan_1d({1024, 1024}, 4, Shard(0), Replicate());
  EXPECT_EQ(gather.steps[0].str(), "all-gather on dim 0 (3.1 MB/rank)");
  EXPECT_EQ(plan_1d({8, 4}, 4, Replicate(), Shard(0)).steps[0].str(), "local chunk on dim 0");
  EXPECT_EQ(plan_1d({8, 4}, 4, Replicate(), Partial()).steps[0].str(), "local partition on dim 0");
}

TEST(PlanFormat, PlanListsItsStepsAfterTheTransition) {
  // [4, 8] floats on a 4x2 mesh: the all-gather on mesh dim 0 assembles all 128 bytes of dim 1.
  const auto plan = plan_redistribute({4, 8}, kFloat, {4, 2}, {0, 0}, {Shard(1), Replicate()}, {Replicate(), Shard(1)});
  EXPECT_EQ(plan.str(), "S(1),R -> R,S(1): all-gather on dim 0 (96 B/rank), then local chunk on dim 1");
  EXPECT_EQ(plan_1d({8, 4}, 4, Shard(0), Partial(ReduceOp::Max)).str(),
            "S(0) -> P(max): all-gather on dim 0 (96 B/rank), then local partition on dim 0");
}

// ---- Multi-dim meshes ---------------------------------------------------------------------------

TEST(Plan2d, NestedShardIsUnshardedInnerFirstThenReshardedAfterTheOuterGather) {
  // [S(0),S(0)]: rank (i, j) holds sub-chunk j of chunk i. Gathering over mesh dim 0 first would
  // collect sub-chunk j of every chunk, which is not a contiguous block, so mesh dim 1 goes first.
  const auto plan =
      plan_redistribute({8, 4}, kFloat, {2, 2}, {1, 0}, {Shard(0), Shard(0)}, {Replicate(), Shard(0)});
  EXPECT_EQ(step_lines(plan), (Lines{"1: S(0)->R all-gather", "0: S(0)->R all-gather", "1: R->S(0) local chunk"}));
  ASSERT_EQ(plan.steps.size(), 3u);
  EXPECT_EQ(plan.steps[0].logical_shape, (Shape{4, 4}));  // the half that mesh dim 0 gave this row
  EXPECT_EQ(plan.steps[1].logical_shape, (Shape{8, 4}));
  EXPECT_EQ(plan.steps[2].logical_shape, (Shape{8, 4}));
  EXPECT_EQ(plan.steps[0].bytes_per_rank, 32);  // half of [4, 4] floats
  EXPECT_EQ(plan.steps[1].bytes_per_rank, 64);  // half of [8, 4] floats
}

TEST(Plan2d, SwappingShardDims) {
  const auto plan =
      plan_redistribute({8, 4}, kFloat, {2, 2}, {0, 1}, {Shard(0), Shard(1)}, {Shard(1), Shard(0)});
  EXPECT_EQ(step_lines(plan),
            (Lines{"1: S(1)->R all-gather", "0: S(0)->S(1) all-to-all", "1: R->S(0) local chunk"}));
  ASSERT_EQ(plan.steps.size(), 3u);
  // The all-to-all on mesh dim 0 sees the whole tensor: mesh dim 1 no longer shards anything.
  EXPECT_EQ(plan.steps[1].logical_shape, (Shape{8, 4}));
  EXPECT_EQ(plan.steps[2].logical_shape, (Shape{8, 2}));  // after S(1) on mesh dim 0
}

TEST(Plan2d, PartialOuterIntoNestedShard) {
  const auto plan =
      plan_redistribute({8, 4}, kFloat, {2, 2}, {0, 0}, {Partial(), Shard(0)}, {Shard(0), Shard(0)});
  EXPECT_EQ(step_lines(plan),
            (Lines{"1: S(0)->R all-gather", "0: P(sum)->S(0) reduce-scatter", "1: R->S(0) local chunk"}));
  ASSERT_EQ(plan.steps.size(), 3u);
  EXPECT_EQ(plan.steps[2].logical_shape, (Shape{4, 4}));  // chunk 0 of the rows, chunked again
}

TEST(Plan2d, InnerDimIsChunkedBeforeTheOuterGather) {
  // Pass 1 settles the inner mesh dim first; chunking there first also halves what the outer
  // all-gather moves (see PlanBytes.CountOnlyWhatTheGroupHoldsWhenOtherMeshDimsShard).
  const auto plan =
      plan_redistribute({8, 4}, kFloat, {4, 2}, {0, 0}, {Shard(0), Replicate()}, {Replicate(), Shard(1)});
  EXPECT_EQ(step_lines(plan), (Lines{"1: R->S(1) local chunk", "0: S(0)->R all-gather"}));
}

TEST(Plan2d, LogicalShapesFollowUnevenOuterShards) {
  // 5 rows over 2 then 2: the outer mesh dim splits 3,2.
  const Placements src = {Shard(0), Shard(0)}, dst = {Replicate(), Replicate()};
  const auto row0 = plan_redistribute({5, 3}, kFloat, {2, 2}, {0, 1}, src, dst);
  const auto row1 = plan_redistribute({5, 3}, kFloat, {2, 2}, {1, 1}, src, dst);
  ASSERT_EQ(step_lines(row0), (Lines{"1: S(0)->R all-gather", "0: S(0)->R all-gather"}));
  ASSERT_EQ(step_lines(row1), step_lines(row0));
  EXPECT_EQ(row0.steps[0].logical_shape, (Shape{3, 3}));
  EXPECT_EQ(row1.steps[0].logical_shape, (Shape{2, 3}));
  EXPECT_EQ(row0.steps[1].logical_shape, (Shape{5, 3}));
  EXPECT_EQ(row1.steps[1].logical_shape, (Shape{5, 3}));
  // 3 rows pad to 2 * 2 = 4 rows of 12 B, half received; 2 rows need no padding; 5 rows pad to 6.
  EXPECT_EQ(row0.steps[0].bytes_per_rank, 24);
  EXPECT_EQ(row1.steps[0].bytes_per_rank, 12);
  EXPECT_EQ(row0.steps[1].bytes_per_rank, 36);

  // S(1) over 3 on the outer dim: 7 columns split 3,3,1, so the last column of ranks gathers [5, 1].
  const auto p = plan_redistribute({5, 7}, kFloat, {3, 2}, {2, 1}, {Shard(1), Shard(0)}, {Shard(1), Replicate()});
  ASSERT_EQ(step_lines(p), (Lines{"1: S(0)->R all-gather"}));
  EXPECT_EQ(p.steps[0].logical_shape, (Shape{5, 1}));
  EXPECT_EQ(p.steps[0].bytes_per_rank, 12);  // 5 rows padded to 6, one float each, half received
}

TEST(Plan3d, OnlyTheChangedMeshDimMoves) {
  const auto plan = plan_redistribute({6, 6, 6}, kFloat, {2, 3, 2}, {1, 2, 0}, {Shard(0), Shard(1), Partial()},
                                      {Shard(0), Shard(1), Shard(2)});
  EXPECT_EQ(step_lines(plan), (Lines{"2: P(sum)->S(2) reduce-scatter"}));
  EXPECT_EQ(plan.steps[0].logical_shape, (Shape{3, 2, 6}));
}

// The collective on an outer mesh dim moves only what the rank holds, which inner mesh dims may
// already have cut along other tensor dims: logical_shape (and so the byte count) is the global
// shape cut by every *other* mesh dim's shard. (Counting from the global shape narrowed by outer mesh
// dims only would report twice the traffic in each case below.)
TEST(PlanBytes, CountOnlyWhatTheGroupHoldsWhenOtherMeshDimsShard) {
  // [8, 4] floats, mesh [4, 2]: the local chunk on mesh dim 1 leaves each rank [2, 2]; the all-gather
  // on mesh dim 0 then assembles [8, 2] (64 B) and receives 3 x [2, 2] floats = 48 B.
  const auto gather =
      plan_redistribute({8, 4}, kFloat, {4, 2}, {0, 0}, {Shard(0), Replicate()}, {Replicate(), Shard(1)});
  ASSERT_EQ(step_lines(gather), (Lines{"1: R->S(1) local chunk", "0: S(0)->R all-gather"}));
  EXPECT_EQ(gather.steps[1].logical_shape, (Shape{8, 2}));
  EXPECT_EQ(gather.steps[1].bytes_per_rank, 48);
  EXPECT_EQ(gather.str(), "S(0),R -> R,S(1): local chunk on dim 1, then all-gather on dim 0 (48 B/rank)");

  // Same for a reduce-scatter: it works on [8, 2] (64 B) and receives 3/4 of it.
  const auto scatter =
      plan_redistribute({8, 4}, kFloat, {4, 2}, {0, 0}, {Partial(), Replicate()}, {Shard(0), Shard(1)});
  ASSERT_EQ(step_lines(scatter), (Lines{"1: R->S(1) local chunk", "0: P(sum)->S(0) reduce-scatter"}));
  EXPECT_EQ(scatter.steps[1].logical_shape, (Shape{8, 2}));
  EXPECT_EQ(scatter.steps[1].bytes_per_rank, 48);

  // And for an all-to-all on the inner dim followed by an all-gather on the outer one, [8, 4] on 2x2:
  // the all-to-all swaps a [2, 4] block for a [4, 2] one (16 B in), then the all-gather receives the
  // other rank's [4, 2] block (32 B).
  const auto swap =
      plan_redistribute({8, 4}, kFloat, {2, 2}, {1, 1}, {Shard(0), Shard(0)}, {Replicate(), Shard(1)});
  ASSERT_EQ(step_lines(swap), (Lines{"1: S(0)->S(1) all-to-all", "0: S(0)->R all-gather"}));
  EXPECT_EQ(swap.steps[0].logical_shape, (Shape{4, 4}));
  EXPECT_EQ(swap.steps[0].bytes_per_rank, 16);
  EXPECT_EQ(swap.steps[1].logical_shape, (Shape{8, 2}));
  EXPECT_EQ(swap.steps[1].bytes_per_rank, 32);
}

// ---- Random property test: the plan is a valid walk from src to dst -----------------------------

// The one step that moves a mesh dim from `from` to `to` directly, by hand from the collectives'
// definitions (Shard -> Partial(sum): each shard padded with zeros); none for Shard -> other Partials
// and Partial(a) -> Partial(b), and none for no change.
std::optional<StepKind> direct_step(const Placement& from, const Placement& to) {
  if (from == to) return std::nullopt;
  if (from.is_shard() && to.is_replicate()) return StepKind::AllGather;
  if (from.is_shard() && to.is_shard()) return StepKind::AllToAll;
  if (from.is_partial() && to.is_replicate()) return StepKind::AllReduce;
  if (from.is_partial() && to.is_shard()) return StepKind::ReduceScatter;
  if (from.is_replicate() && to.is_shard()) return StepKind::LocalChunk;
  if (from.is_replicate() && to.is_partial()) return StepKind::LocalPartition;
  if (from.is_shard() && to.is_partial() && to.reduce_op() == ReduceOp::Sum) return StepKind::LocalPad;
  return std::nullopt;
}

// The tensor dims whose chunking a step reads or writes.
std::vector<int64_t> touched_tensor_dims(const RedistributeStep& s) {
  std::vector<int64_t> dims;
  if (s.from.is_shard()) dims.push_back(s.from.dim());
  if (s.to.is_shard()) dims.push_back(s.to.dim());
  return dims;
}


// Checks one rank's plan step by step against the state it is applied to.
void check_walk(const RedistributePlan& plan, const Placements& src, const Placements& dst) {
  Placements state = src;
  std::map<int64_t, int> steps_per_mesh_dim;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const RedistributeStep& s = plan.steps[i];
    SCOPED_TRACE("step " + std::to_string(i) + " (" + s.str() + ")");
    ASSERT_GE(s.mesh_dim, 0);
    ASSERT_LT(s.mesh_dim, static_cast<int64_t>(state.size()));
    const auto m = static_cast<size_t>(s.mesh_dim);
    EXPECT_EQ(s.from, state[m]) << "the step starts from a placement the mesh dim is not in";
    EXPECT_NE(s.from, s.to) << "no-op step";
    const std::optional<StepKind> kind = direct_step(s.from, s.to);
    ASSERT_TRUE(kind.has_value()) << s.from << " -> " << s.to << " is not a single step";
    EXPECT_EQ(to_string(s.kind), to_string(*kind));
    if (!is_collective(s.kind)) EXPECT_EQ(s.bytes_per_rank, 0) << "a local step moves no bytes";
    EXPECT_GE(s.bytes_per_rank, 0);
    // A step on mesh dim m may only re-chunk a tensor dim that no inner mesh dim (> m) still shards:
    // the rank would otherwise hold a sub-chunk, and the collective would assemble sub-chunks of
    // different chunks (the nesting order outer-first would break).
    for (int64_t d : touched_tensor_dims(s))
      for (size_t inner = m + 1; inner < state.size(); ++inner)
        EXPECT_FALSE(state[inner].is_shard(d))
            << "mesh dim " << inner << " still shards tensor dim " << d << " in state " << state;
    ++steps_per_mesh_dim[s.mesh_dim];
    state[m] = s.to;
  }
  EXPECT_EQ(state, dst) << "the plan does not end at dst";
  // At most an unshard/reduce to Replicate and one local re-chunk/partition per mesh dim.
  for (const auto& [m, count] : steps_per_mesh_dim) EXPECT_LE(count, 2) << "mesh dim " << m;
  if (src == dst) EXPECT_TRUE(plan.steps.empty());
}

Placement random_placement(std::mt19937& rng, int64_t tensor_ndim) {
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
  const int64_t pick = std::uniform_int_distribution<int64_t>(0, tensor_ndim + 1)(rng);
  if (pick < tensor_ndim) return Shard(pick);
  if (pick == tensor_ndim) return Replicate();
  return Partial(ops[std::uniform_int_distribution<int>(0, 3)(rng)]);
}

// Random valid placements (mixes of Partial ops that validate_placements refuses are drawn again).
Placements random_placements(std::mt19937& rng, int64_t mesh_ndim, int64_t tensor_ndim) {
  while (true) {
    Placements ps;
    for (int64_t m = 0; m < mesh_ndim; ++m) ps.push_back(random_placement(rng, tensor_ndim));
    try {
      return validate_placements(ps, mesh_ndim, tensor_ndim, "test");
    } catch (const DTensorError&) {
    }
  }
}

TEST(PlanProperty, RandomPlansWalkFromSrcToDstAndAllRanksAgree) {
  std::mt19937 rng(7);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int iter = 0; iter < 1500; ++iter) {
    Shape mesh(static_cast<size_t>(uniform(1, 3)));
    for (auto& s : mesh) s = uniform(1, 4);
    Shape global(static_cast<size_t>(uniform(0, 3)));
    for (auto& s : global) s = uniform(0, 9);
    const auto mesh_ndim = static_cast<int64_t>(mesh.size()), tensor_ndim = static_cast<int64_t>(global.size());
    const Placements src = random_placements(rng, mesh_ndim, tensor_ndim);
    // Every few cases, a no-op redistribution.
    const Placements dst = iter % 10 == 0 ? src : random_placements(rng, mesh_ndim, tensor_ndim);
    SCOPED_TRACE("mesh " + ::testing::PrintToString(mesh) + " global " + ::testing::PrintToString(global) + ": " +
                 to_string(src) + " -> " + to_string(dst));

    const std::vector<Shape> coords = all_coordinates(mesh);
    std::vector<RedistributePlan> plans;
    for (const auto& coord : coords) {
      plans.push_back(plan_redistribute(global, kFloat, mesh, coord, src, dst));
      SCOPED_TRACE("coordinate " + ::testing::PrintToString(coord));
      EXPECT_EQ(plans.back().src, src);
      EXPECT_EQ(plans.back().dst, dst);
      check_walk(plans.back(), src, dst);
    }

    // Collectives must match across ranks or they deadlock: every rank plans the same steps.
    for (size_t r = 1; r < plans.size(); ++r)
      ASSERT_EQ(step_lines(plans[r]), step_lines(plans[0])) << "coordinate " << ::testing::PrintToString(coords[r]);
    // Ranks of one process group (coordinates differing only on the step's mesh dim) must agree on
    // the logical shape (it sets the padding) and on the padded size of what they exchange.
    for (size_t r = 0; r < plans.size(); ++r)
      for (size_t i = 0; i < plans[r].steps.size(); ++i) {
        const RedistributeStep& s = plans[r].steps[i];
        Shape leader = coords[r];
        leader[static_cast<size_t>(s.mesh_dim)] = 0;
        const size_t l = static_cast<size_t>(std::find(coords.begin(), coords.end(), leader) - coords.begin());
        EXPECT_EQ(s.logical_shape, plans[l].steps[i].logical_shape)
            << "step " << i << " at " << ::testing::PrintToString(coords[r]);
        if (s.kind == StepKind::AllGather || s.kind == StepKind::ReduceScatter || s.kind == StepKind::AllReduce)
          EXPECT_EQ(s.bytes_per_rank, plans[l].steps[i].bytes_per_rank)
              << "step " << i << " at " << ::testing::PrintToString(coords[r]);
      }
    if (mesh_ndim == 1) {
      // On one mesh dim: nothing, one direct step, or two through Replicate.
      const size_t expected = src == dst ? 0 : direct_step(src[0], dst[0]) ? 1 : 2;
      EXPECT_EQ(plans[0].steps.size(), expected);
    }
    if (::testing::Test::HasFailure()) return;  // one failing case is enough to read
  }
}

// A StridedShard is gathered to Replicate, or cut from it, and every other move goes through Replicate.
TEST(PlanRedistribute, StridedShardPlansGoThroughReplicate) {
  auto plan = [](Placements from, Placements to) { return plan_redistribute({96, 4}, 4, {2}, {0}, from, to); };
  EXPECT_EQ(step_lines(plan({StridedShard(0, 8)}, {Replicate()})), (Lines{"0: SS(0,8)->R all-gather"}));
  EXPECT_EQ(step_lines(plan({Replicate()}, {StridedShard(0, 8)})), (Lines{"0: R->SS(0,8) local chunk"}));
  EXPECT_EQ(step_lines(plan({StridedShard(0, 8)}, {Shard(1)})),
            (Lines{"0: SS(0,8)->R all-gather", "0: R->S(1) local chunk"}));
  EXPECT_EQ(step_lines(plan({Partial()}, {StridedShard(0, 8)})),
            (Lines{"0: P(sum)->R all-reduce", "0: R->SS(0,8) local chunk"}));
  // The all-gather receives the other rank's half: 96 * 4 floats / 2.
  EXPECT_EQ(plan({StridedShard(0, 8)}, {Replicate()}).total_bytes_per_rank(), 96 * 4 * 4 / 2);
  // Uneven blocks are padded per block: 3 blocks of 5 over 2 ranks are padded to 3 of 6.
  EXPECT_EQ(plan_redistribute({15}, 4, {2}, {0}, {StridedShard(0, 3)}, {Replicate()}).total_bytes_per_rank(),
            18 * 4 / 2);
}

// A HeadTailShard moves as a strided shard does: gathered to Replicate, cut from it.
TEST(PlanRedistribute, HeadTailShardPlansGoThroughReplicate) {
  auto plan = [](Placements from, Placements to) { return plan_redistribute({16, 4}, 4, {4}, {1}, from, to); };
  EXPECT_EQ(step_lines(plan({HeadTailShard(0)}, {Replicate()})), (Lines{"0: HT(0)->R all-gather"}));
  EXPECT_EQ(step_lines(plan({Replicate()}, {HeadTailShard(0)})), (Lines{"0: R->HT(0) local chunk"}));
  EXPECT_EQ(step_lines(plan({Shard(0)}, {HeadTailShard(0)})), (Lines{"0: S(0)->R all-gather", "0: R->HT(0) local chunk"}));
  EXPECT_EQ(step_lines(plan({HeadTailShard(0)}, {Shard(1)})), (Lines{"0: HT(0)->R all-gather", "0: R->S(1) local chunk"}));
  // The all-gather receives the other ranks' three quarters: 16 * 4 floats * 3 / 4.
  EXPECT_EQ(plan({HeadTailShard(0)}, {Replicate()}).total_bytes_per_rank(), 16 * 4 * 4 * 3 / 4);
}

TEST(PlanRedistribute, StridedShardPlansOnTwoDimMeshReplicateTheInnerShardOfTheSameDimFirst) {
  // SS(0,2) on the outer mesh dim and a target S(0) on the inner one: the inner shard may only be cut
  // once the outer one is gone.
  const auto plan = plan_redistribute({8, 4}, 4, {2, 2}, {0, 0}, {StridedShard(0, 2), Replicate()},
                                      {Replicate(), Shard(0)});
  EXPECT_EQ(step_lines(plan), (Lines{"0: SS(0,2)->R all-gather", "1: R->S(0) local chunk"}));
}

}  // namespace
}  // namespace dtensor
