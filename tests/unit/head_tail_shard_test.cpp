// HeadTailShard as a placement: its value semantics, the shard shapes it gives (checked against
// torch.chunk of 2n chunks) and the checks that refuse it where it cannot be. The plans that move a
// tensor into and out of it are in plan_test.cpp, real ranks in tests/dist/head_tail_shard_test.cpp.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../support/error_of.h"
#include "dtensor/layout.h"
#include "dtensor/placement.h"

namespace dtensor {
namespace {

using testing::error_of;

TEST(HeadTailShard, IsItsOwnKindOfSharding) {
  const Placement p = HeadTailShard(1);
  EXPECT_TRUE(p.is_head_tail_shard());
  EXPECT_TRUE(p.is_sharding());
  EXPECT_TRUE(p.is_multi_run_shard());
  EXPECT_FALSE(p.is_shard());  // code written for one torch.chunk piece must not take it for one
  EXPECT_FALSE(p.is_strided_shard());  // nor for a strided shard's blocks
  EXPECT_EQ(p.dim(), 1);
  EXPECT_EQ(p.str(), "HT(1)");
  EXPECT_NE(p, Shard(1));
  EXPECT_NE(p, StridedShard(1, 2));
  EXPECT_NE(p, HeadTailShard(0));
  EXPECT_EQ(p, HeadTailShard(1));
  EXPECT_NE(p.hash(), StridedShard(1, 2).hash());
  EXPECT_EQ(HeadTailShard(-1).normalized(3), HeadTailShard(2));
  EXPECT_EQ(HeadTailShard(2).with_dim(0), HeadTailShard(0));
  EXPECT_NE(error_of([] { HeadTailShard(3).normalized(3); }).find("HeadTailShard(3) is out of range"), std::string::npos);
}

TEST(HeadTailShard, LocalShapesAreTwoOfTwiceAsManyChunks) {
  for (int64_t ranks = 1; ranks <= 4; ++ranks)
    for (int64_t chunk = 1; chunk <= 3; ++chunk)
      for (int64_t q = 0; q < ranks; ++q) {
        const at::Tensor whole = at::arange(2 * ranks * chunk);
        const std::vector<at::Tensor> chunks = whole.chunk(2 * ranks);
        const int64_t expected = chunks[q].numel() + chunks[2 * ranks - 1 - q].numel();
        EXPECT_EQ(local_shape({3, whole.numel()}, {ranks}, {q}, {HeadTailShard(1)}), (Shape{3, expected}))
            << chunk << " per chunk over " << ranks << ", rank " << q;
      }
}

TEST(HeadTailShard, IsRefusedWhereItCannotBe) {
  // Not 2 whole chunks per rank.
  const std::string uneven = error_of([] { local_shape({12}, {4}, {0}, {HeadTailShard(0)}); });
  EXPECT_NE(uneven.find("HT(0) over 4 ranks: a load-balanced sequence of 12 positions does not split into 2 x 4 equal chunks"),
            std::string::npos)
      << uneven;
  // No box: offsets into the global tensor do not describe it.
  EXPECT_NE(error_of([] { local_layout({8}, {2}, {0}, {HeadTailShard(0)}); }).find("head-tail shard"), std::string::npos);
  // The only sharding of its dim.
  const std::string both = error_of([] { validate_placements({Shard(0), HeadTailShard(0)}, 2, 1, "test"); });
  EXPECT_NE(both.find("only sharding of its dim"), std::string::npos) << both;
  EXPECT_NO_THROW(validate_placements({Shard(0), HeadTailShard(1)}, 2, 2, "test"));
}

}  // namespace
}  // namespace dtensor
