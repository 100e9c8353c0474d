// StridedShard as a placement: its value semantics, the shard shapes it gives (checked against
// torch.chunk of every block) and the checks that refuse it where it cannot be. The plans that move a
// tensor into and out of it are in plan_test.cpp.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../strided_piece.h"
#include "../support/error_of.h"
#include "unit_helpers.h"

namespace dtensor {
namespace {

using testing::error_of;

TEST(StridedShard, IsItsOwnKindAndPrintsItsBlocks) {
  const Placement p = StridedShard(0, 8);
  EXPECT_TRUE(p.is_strided_shard());
  EXPECT_TRUE(p.is_sharding());
  EXPECT_FALSE(p.is_shard());  // code written for one torch.chunk piece must not take it for one
  EXPECT_FALSE(p.is_replicate());
  EXPECT_EQ(p.dim(), 0);
  EXPECT_EQ(p.split_factor(), 8);
  EXPECT_EQ(p.str(), "SS(0,8)");
  EXPECT_NE(p, Shard(0));
  EXPECT_NE(p, StridedShard(0, 4));
  EXPECT_NE(p, StridedShard(1, 8));
  EXPECT_EQ(p, StridedShard(0, 8));
  EXPECT_NE(p.hash(), StridedShard(0, 4).hash());
  EXPECT_EQ(Shard(1).split_factor(), 1);
  // One block is a plain shard.
  EXPECT_EQ(StridedShard(2, 1), Shard(2));
  EXPECT_EQ(StridedShard(-1, 3).normalized(2), StridedShard(1, 3));
  EXPECT_NE(error_of([] { StridedShard(0, 0); }).find("at least 1"), std::string::npos);
  EXPECT_NE(error_of([] { StridedShard(2, 3).normalized(2); }).find("StridedShard(2, 3) is out of range"), std::string::npos);
}

TEST(StridedShard, LocalShapesAreTorchChunksOfEveryBlock) {
  for (int64_t blocks : {2, 3, 4})
    for (int64_t block = 1; block <= 7; ++block)
      for (int64_t ranks = 1; ranks <= 4; ++ranks)
        for (int64_t q = 0; q < ranks; ++q) {
          const at::Tensor full = at::arange(blocks * block * 2).view({2, blocks * block});
          const Shape shape =
              local_shape({2, blocks * block}, {ranks}, {q}, {StridedShard(1, blocks)});
          EXPECT_EQ(shape, testing::strided_piece(full, 1, blocks, ranks, q).sizes().vec())
              << blocks << " blocks of " << block << " over " << ranks << ", rank " << q;
        }
}

TEST(StridedShard, OnTwoDimMeshWithAnotherShardedDim) {
  // [4, 6] with S(0) over the first mesh dim (2) and SS(1,2) over the second (3): blocks of 3 in 3.
  EXPECT_EQ(local_shape({4, 6}, {2, 3}, {1, 2}, {Shard(0), StridedShard(1, 2)}), (Shape{2, 2}));
  EXPECT_EQ(global_shape_assuming_even({2, 2}, {2, 3}, {Shard(0), StridedShard(1, 2)}), (Shape{4, 6}));
}

TEST(StridedShard, IsRefusedWhereItCannotBe) {
  // No box: offsets into the global tensor do not describe it.
  EXPECT_NE(error_of([] { local_layout({8}, {2}, {0}, {StridedShard(0, 2)}); }).find("strided shard"),
            std::string::npos);
  // Blocks must divide the dim.
  EXPECT_NE(error_of([] { local_shape({7}, {2}, {0}, {StridedShard(0, 2)}); }).find("whole blocks"),
            std::string::npos);
  // The only sharding of its dim.
  const std::string both = error_of([] { validate_placements({Shard(0), StridedShard(0, 2)}, 2, 1, "test"); });
  EXPECT_NE(both.find("only sharding of its dim"), std::string::npos) << both;
  EXPECT_NO_THROW(validate_placements({Shard(1), StridedShard(0, 2)}, 2, 2, "test"));
}

}  // namespace
}  // namespace dtensor
