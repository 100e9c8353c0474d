// Placement is a value type: equality, hashing, printing and dim normalisation are what every other
// layer (layout, planner, plan cache) builds on, so they are pinned down here.

#include "../support/error_of.h"
#include "unit_helpers.h"
#include "dtensor/placement.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "dtensor/errors.h"

namespace dtensor {
namespace {

using dtensor::testing::error_of;

const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

// One of each kind of placement, all pairwise different.
std::vector<Placement> distinct_placements() {
  std::vector<Placement> out = {Replicate()};
  for (int64_t d = -2; d < 4; ++d) out.push_back(Shard(d));
  for (ReduceOp op : kOps) out.push_back(Partial(op));
  return out;
}


TEST(Placement, KindPredicates) {
  EXPECT_TRUE(Shard(1).is_shard());
  EXPECT_TRUE(Shard(1).is_shard(1));
  EXPECT_FALSE(Shard(1).is_shard(0));
  EXPECT_EQ(Shard(1).dim(), 1);
  EXPECT_EQ(Shard(1).kind(), Placement::Kind::Shard);

  EXPECT_TRUE(Replicate().is_replicate());
  EXPECT_FALSE(Replicate().is_shard());
  // A Replicate is not "Shard(0)" even though its unused dim field is 0.
  EXPECT_FALSE(Replicate().is_shard(0));
  EXPECT_FALSE(Partial().is_shard(0));

  EXPECT_TRUE(Partial(ReduceOp::Max).is_partial());
  EXPECT_EQ(Partial(ReduceOp::Max).reduce_op(), ReduceOp::Max);
  // Partial's default op is sum, as in PyTorch.
  EXPECT_EQ(Partial().reduce_op(), ReduceOp::Sum);
}

TEST(Placement, EqualityComparesDimsForShardAndOpsForPartial) {
  EXPECT_EQ(Shard(0), Shard(0));
  EXPECT_NE(Shard(0), Shard(1));
  // Not normalised: Shard(-1) only equals Shard(1) after normalized(2).
  EXPECT_NE(Shard(-1), Shard(1));
  EXPECT_EQ(Replicate(), Replicate());
  EXPECT_EQ(Partial(), Partial(ReduceOp::Sum));
  EXPECT_NE(Partial(ReduceOp::Sum), Partial(ReduceOp::Max));
  EXPECT_NE(Partial(ReduceOp::Avg), Partial(ReduceOp::Sum));
  EXPECT_NE(Partial(ReduceOp::Min), Partial(ReduceOp::Max));
  // Different kinds never compare equal, even where the unused fields coincide.
  EXPECT_NE(Shard(0), Replicate());
  EXPECT_NE(Shard(0), Partial());
  EXPECT_NE(Replicate(), Partial());

  const auto all = distinct_placements();
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = 0; j < all.size(); ++j) {
      EXPECT_EQ(all[i] == all[j], i == j) << all[i] << " vs " << all[j];
      EXPECT_EQ(all[i] != all[j], i != j) << all[i] << " vs " << all[j];
    }
}

TEST(Placement, EqualPlacementsHashEqually) {
  // Built separately so that equality, not identity, is what is tested.
  EXPECT_EQ(Shard(2).hash(), Shard(2).hash());
  EXPECT_EQ(Replicate().hash(), Replicate().hash());
  EXPECT_EQ(Partial().hash(), Partial(ReduceOp::Sum).hash());
  EXPECT_EQ(std::hash<Placement>{}(Shard(3)), Shard(3).hash());
  EXPECT_EQ(Shard(-1).normalized(3).hash(), Shard(2).hash());
}

TEST(Placement, UnorderedSetKeepsOneOfEachDistinctPlacement) {
  std::unordered_set<Placement> set;
  const auto all = distinct_placements();
  // Insert everything twice: the second round must add nothing.
  for (int round = 0; round < 2; ++round)
    for (const auto& p : all) set.insert(p);
  EXPECT_EQ(set.size(), all.size());
  for (const auto& p : all) EXPECT_EQ(set.count(p), 1u) << p;
  EXPECT_EQ(set.count(Shard(7)), 0u);
}

TEST(Placement, PlacementListsHashEquallyWhenEqual) {
  const Placements a = {Shard(0), Replicate(), Partial(ReduceOp::Max)};
  const Placements b = {Shard(0), Replicate(), Partial(ReduceOp::Max)};
  EXPECT_EQ(hash_placements(a), hash_placements(b));
  EXPECT_EQ(hash_placements({}), hash_placements({}));
}

TEST(Placement, ShortPrinting) {
  EXPECT_EQ(Shard(0).str(), "S(0)");
  EXPECT_EQ(Shard(12).str(), "S(12)");
  EXPECT_EQ(Shard(-1).str(), "S(-1)");
  EXPECT_EQ(Replicate().str(), "R");
  EXPECT_EQ(Partial().str(), "P(sum)");
  EXPECT_EQ(Partial(ReduceOp::Avg).str(), "P(avg)");
  EXPECT_EQ(Partial(ReduceOp::Max).str(), "P(max)");
  EXPECT_EQ(Partial(ReduceOp::Min).str(), "P(min)");

  EXPECT_EQ(to_string(ReduceOp::Sum), "sum");
  EXPECT_EQ(to_string(ReduceOp::Min), "min");
}

TEST(Placement, ListPrintingIsCommaSeparatedWithoutSpaces) {
  EXPECT_EQ(to_string(Placements{Shard(0), Replicate()}), "S(0),R");
  EXPECT_EQ(to_string(Placements{Partial(ReduceOp::Max), Shard(1), Replicate()}), "P(max),S(1),R");
  EXPECT_EQ(to_string(Placements{Replicate()}), "R");
  EXPECT_EQ(to_string(Placements{}), "");
}

TEST(Placement, StreamOperatorsUseTheShortForm) {
  std::ostringstream one, list;
  one << Shard(3);
  list << Placements{Replicate(), Partial()};
  EXPECT_EQ(one.str(), "S(3)");
  EXPECT_EQ(list.str(), "R,P(sum)");
}

TEST(Placement, NormalizedMapsNegativeDimsFromTheEnd) {
  EXPECT_EQ(Shard(-1).normalized(3), Shard(2));
  EXPECT_EQ(Shard(-3).normalized(3), Shard(0));
  EXPECT_EQ(Shard(-1).normalized(1), Shard(0));
  // In-range dims are left alone.
  EXPECT_EQ(Shard(0).normalized(3), Shard(0));
  EXPECT_EQ(Shard(2).normalized(3), Shard(2));
}

TEST(Placement, NormalizedLeavesNonShardPlacementsAlone) {
  // Replicate and Partial fit any tensor, a 0-d one included.
  EXPECT_EQ(Replicate().normalized(0), Replicate());
  EXPECT_EQ(Partial(ReduceOp::Min).normalized(0), Partial(ReduceOp::Min));
  EXPECT_EQ(Partial(ReduceOp::Avg).normalized(5), Partial(ReduceOp::Avg));
}

TEST(Placement, NormalizedRejectsOutOfRangeDimsNamingDimAndRange) {
  // Exact message: it names the requested dim, the tensor's rank and the valid half-open range.
  EXPECT_EQ(error_of([] { Shard(3).normalized(3); }),
            "dtensor: Shard(3) is out of range for a tensor with 3 dimension(s); pick a dim in [-3, 3)");
  EXPECT_EQ(error_of([] { Shard(-4).normalized(3); }),
            "dtensor: Shard(-4) is out of range for a tensor with 3 dimension(s); pick a dim in [-3, 3)");
  // A 0-d tensor cannot be sharded at all.
  EXPECT_EQ(error_of([] { Shard(0).normalized(0); }),
            "dtensor: Shard(0) is out of range for a tensor with 0 dimension(s); pick a dim in [0, 0)");
  EXPECT_THROW(Shard(-1).normalized(0), DTensorError);
  EXPECT_THROW(Shard(100).normalized(2), DTensorError);
}

}  // namespace
}  // namespace dtensor
