// Box math the checkpoint loader and cross-mesh redistribution plan with, against torch: pieces_of
// against the local layouts of every coordinate, and runs_within against narrow() on a real tensor.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <random>

#include "dtensor/pieces.h"
#include "unit_helpers.h"

namespace dtensor {
namespace {

using dtensor::unit::all_coordinates;

TEST(PiecesTest, EveryCoordinatesBoxOnceWithItsHolders) {
  const Shape global = {10, 7};
  const Shape mesh = {2, 3};
  const std::vector<int64_t> ranks = {5, 4, 3, 2, 1, 0};  // any order of global ranks
  for (const Placements& placements : std::vector<Placements>{
           {Shard(0), Shard(1)}, {Replicate(), Shard(0)}, {Shard(1), Shard(1)}, {Partial(ReduceOp::Sum), Replicate()}}) {
    const std::vector<Piece> pieces = pieces_of(global, mesh, ranks, placements);
    int64_t held = 0;
    for (const Piece& p : pieces) held += numel(p.box.shape);
    EXPECT_EQ(held, numel(global)) << to_string(placements);  // disjoint and covering
    const auto coordinates = all_coordinates(mesh);
    for (size_t i = 0; i < coordinates.size(); ++i) {
      const LocalLayout l = local_layout(global, mesh, coordinates[i], placements);
      if (numel(l.shape) == 0) continue;
      const auto it = std::find_if(pieces.begin(), pieces.end(), [&](const Piece& p) { return p.box == Box{l.offset, l.shape}; });
      ASSERT_NE(it, pieces.end());
      EXPECT_NE(std::find(it->holders.begin(), it->holders.end(), ranks[i]), it->holders.end());
    }
  }
  // 5 rows over 4: the empty fourth shard is no piece.
  EXPECT_EQ(pieces_of({5}, {4}, {0, 1, 2, 3}, {Shard(0)}).size(), 3u);
}

TEST(PiecesTest, IntersectIsTheOverlapOrNothing) {
  EXPECT_EQ(*intersect(Box{{0, 2}, {4, 4}}, Box{{2, 0}, {4, 3}}), (Box{{2, 2}, {2, 1}}));
  EXPECT_FALSE(intersect(Box{{0, 0}, {2, 2}}, Box{{2, 0}, {2, 2}}).has_value());
  EXPECT_TRUE(intersect(Box{{}, {}}, Box{{}, {}}).has_value());  // 0-d tensors overlap whole
}

// Every part of random pieces read through runs_within equals narrow() of the piece.
TEST(PiecesTest, RunsCopyExactlyThePart) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t ndim = trial % 4;
    Box piece{Shape(ndim), Shape(ndim)}, part{Shape(ndim), Shape(ndim)};
    for (int64_t d = 0; d < ndim; ++d) {
      piece.offset[d] = rng() % 5;
      piece.shape[d] = 1 + rng() % 6;
      part.shape[d] = 1 + rng() % piece.shape[d];
      part.offset[d] = piece.offset[d] + rng() % (piece.shape[d] - part.shape[d] + 1);
    }
    const at::Tensor data = at::arange(numel(piece.shape), at::kLong).reshape(piece.shape);
    at::Tensor expected = data;
    for (int64_t d = 0; d < ndim; ++d) expected = expected.narrow(d, part.offset[d] - piece.offset[d], part.shape[d]);
    at::Tensor got = at::full(part.shape, -1, at::kLong);
    const auto runs = runs_within(piece, part);
    for (const ContiguousRun& r : runs)
      std::copy_n(data.data_ptr<int64_t>() + r.piece_offset, r.length, got.data_ptr<int64_t>() + r.part_offset);
    ASSERT_TRUE(at::equal(got, expected)) << "trial " << trial;
    // As few runs as the row-major order allows: one when the part is a contiguous slab of the piece.
    if (ndim > 0 && std::equal(part.shape.begin() + 1, part.shape.end(), piece.shape.begin() + 1)) EXPECT_EQ(runs.size(), 1u);
  }
}

}  // namespace
}  // namespace dtensor
