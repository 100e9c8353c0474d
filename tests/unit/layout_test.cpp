// Layout math against torch's own at::chunk: which box of the global tensor each rank holds, how
// placements are validated, and the shape/stride helpers DTensor metadata is built from.

#include "../support/error_of.h"
#include "unit_helpers.h"
#include "dtensor/layout.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/errors.h"

namespace dtensor {
namespace {

using dtensor::unit::all_coordinates;
using dtensor::testing::error_of;

// ---- Oracles built on torch ----------------------------------------------------------------------

// Piece `index` of `length` elements split by torch's own chunk. at::chunk returns fewer than
// `num_chunks` pieces when the length does not fill them all; the missing trailing pieces are empty
// and start at the end. The offset of a non-empty piece is read from the data (an arange).
ChunkExtent torch_chunk(int64_t length, int64_t num_chunks, int64_t index) {
  const std::vector<at::Tensor> pieces = at::arange(length, at::kLong).chunk(num_chunks);
  if (index >= static_cast<int64_t>(pieces.size())) return {0, length};
  const at::Tensor& piece = pieces[static_cast<size_t>(index)];
  if (piece.numel() == 0) return {0, length};
  return {piece.numel(), piece[0].item<int64_t>()};
}

// The local layout by repeated torch.chunk: for every tensor dim, the mesh dims that shard it chunk
// it in mesh-dim order (outer first), each chunking the piece the previous one left.
LocalLayout torch_local_layout(const Shape& global, const Shape& mesh, const Shape& coord,
                               const Placements& placements) {
  LocalLayout out{global, Shape(global.size(), 0)};
  for (size_t m = 0; m < placements.size(); ++m) {
    if (!placements[m].is_shard()) continue;
    const auto d = static_cast<size_t>(placements[m].dim());
    const ChunkExtent piece = torch_chunk(out.shape[d], mesh[m], coord[m]);
    out.offset[d] += piece.offset;
    out.shape[d] = piece.size;
  }
  return out;
}

Shape sizes_of(const at::Tensor& t) { return t.sizes().vec(); }
Shape strides_of(const at::Tensor& t) { return t.strides().vec(); }


std::string describe(const Shape& global, const Shape& mesh, const Placements& placements) {
  std::ostringstream s;
  s << "global " << at::IntArrayRef(global) << " mesh " << at::IntArrayRef(mesh) << " placements "
    << placements;
  return s.str();
}


// ---- chunk_extent / padded_chunk_size ----------------------------------------------------------

void expect_chunks(int64_t length, int64_t num_chunks, const Shape& sizes, const Shape& offsets) {
  SCOPED_TRACE(std::to_string(length) + " over " + std::to_string(num_chunks));
  for (int64_t i = 0; i < num_chunks; ++i) {
    const ChunkExtent c = chunk_extent(length, num_chunks, i);
    EXPECT_EQ(c.size, sizes[i]) << "chunk " << i;
    EXPECT_EQ(c.offset, offsets[i]) << "chunk " << i;
  }
}

TEST(ChunkExtent, HandDerivedTorchChunkSemantics) {
  // ceil(5/4) = 2: two full chunks, a partial one, and an empty one at the end.
  expect_chunks(5, 4, {2, 2, 1, 0}, {0, 2, 4, 5});
  expect_chunks(0, 3, {0, 0, 0}, {0, 0, 0});
  expect_chunks(7, 3, {3, 3, 1}, {0, 3, 6});
  expect_chunks(8, 4, {2, 2, 2, 2}, {0, 2, 4, 6});
  // torch.chunk does not balance: 6 over 4 is 2,2,2,0 (not 2,2,1,1).
  expect_chunks(6, 4, {2, 2, 2, 0}, {0, 2, 4, 6});
  // Fewer elements than chunks: one element each, then empties.
  expect_chunks(2, 4, {1, 1, 0, 0}, {0, 1, 2, 2});
  expect_chunks(9, 1, {9}, {0});
}

TEST(ChunkExtent, MatchesAtChunkForAllSmallCases) {
  for (int64_t length = 0; length <= 20; ++length)
    for (int64_t n = 1; n <= 8; ++n)
      for (int64_t i = 0; i < n; ++i) {
        const ChunkExtent expected = torch_chunk(length, n, i), actual = chunk_extent(length, n, i);
        EXPECT_EQ(actual.size, expected.size) << length << " over " << n << ", chunk " << i;
        EXPECT_EQ(actual.offset, expected.offset) << length << " over " << n << ", chunk " << i;
      }
}

TEST(ChunkExtent, PaddedChunkSizeIsTheCeiling) {
  EXPECT_EQ(padded_chunk_size(5, 4), 2);
  EXPECT_EQ(padded_chunk_size(8, 4), 2);
  EXPECT_EQ(padded_chunk_size(9, 4), 3);
  EXPECT_EQ(padded_chunk_size(0, 3), 0);
  EXPECT_EQ(padded_chunk_size(1, 3), 1);
  EXPECT_EQ(padded_chunk_size(7, 1), 7);
  // It is the size of torch's first (largest) chunk.
  for (int64_t length = 1; length <= 20; ++length)
    for (int64_t n = 1; n <= 8; ++n)
      EXPECT_EQ(padded_chunk_size(length, n), at::arange(length).chunk(n)[0].numel()) << length << " over " << n;
}

// ---- local_layout --------------------------------------------------------------------------------

void expect_layout(const Shape& global, const Shape& mesh, const Shape& coord, const Placements& placements,
                   const Shape& shape, const Shape& offset) {
  const LocalLayout l = local_layout(global, mesh, coord, placements);
  EXPECT_EQ(l.shape, shape) << describe(global, mesh, placements) << " at " << at::IntArrayRef(coord);
  EXPECT_EQ(l.offset, offset) << describe(global, mesh, placements) << " at " << at::IntArrayRef(coord);
}

TEST(LocalLayout, OneDimMeshUnevenShard) {
  const Placements p = {Shard(0)};
  expect_layout({5, 3}, {4}, {0}, p, {2, 3}, {0, 0});
  expect_layout({5, 3}, {4}, {1}, p, {2, 3}, {2, 0});
  expect_layout({5, 3}, {4}, {2}, p, {1, 3}, {4, 0});
  expect_layout({5, 3}, {4}, {3}, p, {0, 3}, {5, 0});
  // Sharding the last dim leaves the first one whole.
  expect_layout({5, 3}, {2}, {1}, {Shard(1)}, {5, 1}, {0, 2});
}

TEST(LocalLayout, ReplicateAndPartialHoldTheWholeTensor) {
  for (int64_t r = 0; r < 3; ++r) {
    expect_layout({4, 2}, {3}, {r}, {Replicate()}, {4, 2}, {0, 0});
    expect_layout({4, 2}, {3}, {r}, {Partial(ReduceOp::Max)}, {4, 2}, {0, 0});
  }
  // A 0-d tensor: empty shape and offset.
  expect_layout({}, {2}, {1}, {Replicate()}, {}, {});
}

TEST(LocalLayout, TwoDimMeshShardingDifferentDims) {
  // [4, 6] on a 2x3 mesh, S(1) over the outer mesh dim and S(0) over the inner one.
  const Placements p = {Shard(1), Shard(0)};
  // dim 1: 6 over 2 -> 3,3; dim 0: 4 over 3 -> 2,2,0.
  expect_layout({4, 6}, {2, 3}, {0, 0}, p, {2, 3}, {0, 0});
  expect_layout({4, 6}, {2, 3}, {1, 1}, p, {2, 3}, {2, 3});
  expect_layout({4, 6}, {2, 3}, {1, 2}, p, {0, 3}, {4, 3});
  // Replicate on the outer dim: only the inner one shards.
  expect_layout({4, 6}, {2, 3}, {1, 1}, {Replicate(), Shard(1)}, {4, 2}, {0, 2});
}

TEST(LocalLayout, OneTensorDimShardedOverTwoMeshDimsChunksOuterFirst) {
  // 10 rows on a 2x3 mesh: the outer dim splits 5,5; each half splits again 2,2,1. A flat chunk of 10
  // over 6 ranks would give 2,2,2,2,2,0 instead, so this pins the nesting.
  const Placements p = {Shard(0), Shard(0)};
  const Shape global = {10, 3}, mesh = {2, 3};
  expect_layout(global, mesh, {0, 0}, p, {2, 3}, {0, 0});
  expect_layout(global, mesh, {0, 1}, p, {2, 3}, {2, 0});
  expect_layout(global, mesh, {0, 2}, p, {1, 3}, {4, 0});
  expect_layout(global, mesh, {1, 0}, p, {2, 3}, {5, 0});
  expect_layout(global, mesh, {1, 1}, p, {2, 3}, {7, 0});
  expect_layout(global, mesh, {1, 2}, p, {1, 3}, {9, 0});
  // 3 rows on 2x2: outer 2,1; inner of the first 1,1; inner of the second 1,0.
  expect_layout({3}, {2, 2}, {0, 1}, p, {1}, {1});
  expect_layout({3}, {2, 2}, {1, 0}, p, {1}, {2});
  expect_layout({3}, {2, 2}, {1, 1}, p, {0}, {3});
}

TEST(LocalLayout, MatchesRepeatedAtChunkOnOneAndTwoDimMeshes) {
  const std::vector<Shape> globals = {{5, 3}, {10, 7}, {1, 9}, {0, 4}, {8, 8}};
  const std::vector<Shape> meshes = {{4}, {3}, {2, 3}, {4, 2}, {3, 3}};
  for (const auto& global : globals)
    for (const auto& mesh : meshes) {
      // Every combination of S(0), S(1), R per mesh dim.
      std::vector<Placements> lists = {{}};
      for (size_t m = 0; m < mesh.size(); ++m) {
        std::vector<Placements> next;
        for (const auto& prefix : lists)
          for (const Placement& p : {Shard(0), Shard(1), Replicate()}) {
            Placements ps = prefix;
            ps.push_back(p);
            next.push_back(ps);
          }
        lists = next;
      }
      for (const auto& placements : lists)
        for (const auto& coord : all_coordinates(mesh)) {
          const LocalLayout expected = torch_local_layout(global, mesh, coord, placements);
          expect_layout(global, mesh, coord, placements, expected.shape, expected.offset);
        }
    }
}

// The boxes of all ranks tile the global tensor: counting, per element, the ranks whose box holds it
// gives the replication factor (the product of the mesh dims that do not shard) everywhere. A gap or
// an overlap between shards would show as a count off by a multiple of that factor.
TEST(LocalLayout, RandomShardsTileTheGlobalTensorExactly) {
  std::mt19937 rng(20240611);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
  for (int iter = 0; iter < 400; ++iter) {
    Shape mesh(static_cast<size_t>(uniform(1, 3)));
    for (auto& s : mesh) s = uniform(1, 4);
    Shape global(static_cast<size_t>(uniform(0, 3)));
    for (auto& s : global) s = uniform(0, 9);
    const auto tensor_ndim = static_cast<int64_t>(global.size());
    // Partial takes one op per list, so the placements stay valid.
    const ReduceOp op = ops[uniform(0, 3)];
    Placements placements;
    int64_t replication = 1;
    for (int64_t size : mesh) {
      const int64_t pick = uniform(0, tensor_ndim + 1);  // a Shard dim, or Replicate, or Partial
      if (pick < tensor_ndim) {
        placements.push_back(Shard(pick));
      } else {
        placements.push_back(pick == tensor_ndim ? Replicate() : Partial(op));
        replication *= size;
      }
    }
    SCOPED_TRACE(describe(global, mesh, placements));

    at::Tensor count = at::zeros(global, at::kLong);
    for (const auto& coord : all_coordinates(mesh)) {
      const LocalLayout l = local_layout(global, mesh, coord, placements);
      const LocalLayout expected = torch_local_layout(global, mesh, coord, placements);
      ASSERT_EQ(l.shape, expected.shape) << "at " << at::IntArrayRef(coord);
      ASSERT_EQ(l.offset, expected.offset) << "at " << at::IntArrayRef(coord);
      at::Tensor box = count;
      for (size_t d = 0; d < global.size(); ++d) {
        ASSERT_GE(l.offset[d], 0);
        ASSERT_LE(l.offset[d] + l.shape[d], global[d]) << "box leaves the tensor along dim " << d;
        box = box.narrow(static_cast<int64_t>(d), l.offset[d], l.shape[d]);
      }
      box += 1;
    }
    EXPECT_TRUE(count.eq(replication).all().item<bool>()) << "coverage counts:\n" << count;
  }
}

// ---- validate_placements -----------------------------------------------------------------------

TEST(ValidatePlacements, RejectsAWrongNumberOfPlacements) {
  const std::string msg = error_of([] { validate_placements({Shard(0)}, 2, 2, "redistribute"); });
  EXPECT_NE(msg.find("redistribute:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 placement(s) (S(0))"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mesh with 2 dimension(s)"), std::string::npos) << msg;
  EXPECT_THROW(validate_placements({Replicate(), Replicate()}, 1, 2, "x"), DTensorError);
  EXPECT_THROW(validate_placements({}, 1, 2, "x"), DTensorError);
}

TEST(ValidatePlacements, RejectsShardDimsOutOfRangeNamingTheCaller) {
  // The caller's name and the whole list come first, then Placement::normalized's own explanation,
  // with a single "dtensor: " prefix.
  EXPECT_EQ(error_of([] { validate_placements({Shard(2), Replicate()}, 2, 2, "from_local"); }),
            "dtensor: from_local: placements (S(2),R): Shard(2) is out of range for a tensor with 2 dimension(s); "
            "pick a dim in [-2, 2)");
  EXPECT_THROW(validate_placements({Replicate(), Shard(-3)}, 2, 2, "x"), DTensorError);
  EXPECT_THROW(validate_placements({Shard(0)}, 1, 0, "x"), DTensorError);
}

TEST(ValidatePlacements, RefusesPartialMixesWhoseResultDependsOnOrder) {
  const std::string msg =
      error_of([] { validate_placements({Partial(ReduceOp::Sum), Partial(ReduceOp::Max)}, 2, 1, "x"); });
  EXPECT_NE(msg.find("P(sum),P(max)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reduction order"), std::string::npos) << msg;
  EXPECT_THROW(validate_placements({Partial(ReduceOp::Max), Partial(ReduceOp::Min)}, 2, 1, "x"), DTensorError);
  EXPECT_THROW(validate_placements({Partial(ReduceOp::Avg), Shard(0), Partial(ReduceOp::Min)}, 3, 1, "x"),
               DTensorError);
}

TEST(ValidatePlacements, AllowsPartialMixesThatCommute) {
  // sum and avg are both linear; a single max or min op is order-free.
  EXPECT_NO_THROW(validate_placements({Partial(ReduceOp::Sum), Partial(ReduceOp::Avg)}, 2, 1, "x"));
  EXPECT_NO_THROW(validate_placements({Partial(ReduceOp::Max), Replicate(), Partial(ReduceOp::Max)}, 3, 1, "x"));
  EXPECT_NO_THROW(validate_placements({Partial(ReduceOp::Min), Partial(ReduceOp::Min)}, 2, 0, "x"));
  EXPECT_NO_THROW(validate_placements({Partial(ReduceOp::Max), Shard(0)}, 2, 1, "x"));
}

TEST(ValidatePlacements, NormalisesNegativeShardDims) {
  EXPECT_EQ(validate_placements({Shard(-1), Shard(-2), Replicate()}, 3, 2, "x"),
            (Placements{Shard(1), Shard(0), Replicate()}));
  EXPECT_EQ(validate_placements({Partial(ReduceOp::Avg), Shard(-3)}, 2, 3, "x"),
            (Placements{Partial(ReduceOp::Avg), Shard(0)}));
}

// ---- shape and stride helpers --------------------------------------------------------------------

TEST(GlobalShapeAssumingEven, MultipliesShardedDimsByTheirMeshSizes) {
  EXPECT_EQ(global_shape_assuming_even({2, 3}, {4}, {Shard(0)}), (Shape{8, 3}));
  EXPECT_EQ(global_shape_assuming_even({2, 3}, {4}, {Replicate()}), (Shape{2, 3}));
  EXPECT_EQ(global_shape_assuming_even({2, 3}, {4}, {Partial()}), (Shape{2, 3}));
  // A dim sharded over two mesh dims grows by both.
  EXPECT_EQ(global_shape_assuming_even({2, 3}, {2, 4}, {Shard(0), Shard(0)}), (Shape{16, 3}));
  EXPECT_EQ(global_shape_assuming_even({2, 3}, {2, 4}, {Shard(1), Shard(0)}), (Shape{8, 6}));
  EXPECT_EQ(global_shape_assuming_even({5}, {3, 2}, {Replicate(), Shard(0)}), (Shape{10}));
  // And is the inverse of local_layout when every shard is full.
  const Shape global = {12, 6}, mesh = {2, 3};
  const Placements p = {Shard(0), Shard(1)};
  EXPECT_EQ(global_shape_assuming_even(local_layout(global, mesh, {1, 2}, p).shape, mesh, p), global);
}

TEST(ContiguousStrides, MatchTorch) {
  for (const Shape& shape : std::vector<Shape>{{}, {5}, {0}, {2, 3}, {4, 5, 6}, {2, 0, 3}, {1, 1}, {3, 1, 2}})
    EXPECT_EQ(contiguous_strides(shape), strides_of(at::empty(shape))) << at::IntArrayRef(shape);
}

// Global strides for a local tensor of some memory order: the same order, laid out densely.
// The oracle permutes a contiguous torch tensor of the global shape the same way.
TEST(GlobalStrideLike, KeepsTheLocalDimensionOrder) {
  // A transposed local tensor gives transposed global strides.
  const at::Tensor local_t = at::empty({2, 3}).t();  // shape [3, 2], strides [1, 3]
  const Shape global_t = {3, 4};
  EXPECT_EQ(global_stride_like(global_t, sizes_of(local_t), strides_of(local_t)), (Shape{1, 3}));
  EXPECT_EQ(global_stride_like(global_t, sizes_of(local_t), strides_of(local_t)),
            strides_of(at::empty({4, 3}).t()));

  // A contiguous local tensor gives contiguous global strides.
  const at::Tensor local_c = at::empty({2, 3, 4});
  EXPECT_EQ(global_stride_like({6, 3, 8}, sizes_of(local_c), strides_of(local_c)), (Shape{24, 8, 1}));

  // Channels-last style: 3-d permutation.
  const std::vector<int64_t> perm = {2, 0, 1};
  const at::Tensor local_p = at::empty({2, 3, 4}).permute(perm);  // shape [4, 2, 3]
  const Shape global_p = {8, 2, 6};
  Shape base(3);  // the contiguous tensor that permute(perm) turns into global_p
  for (size_t i = 0; i < 3; ++i) base[static_cast<size_t>(perm[i])] = global_p[i];
  EXPECT_EQ(global_stride_like(global_p, sizes_of(local_p), strides_of(local_p)),
            strides_of(at::empty(base).permute(perm)));
}

TEST(GlobalStrideLike, TiesKeepTheNaturalOrderAndEmptyDimsCountAsOne) {
  // [4, 1] contiguous has strides [1, 1]: a tie, so dim 0 stays outer.
  EXPECT_EQ(global_stride_like({8, 2}, {4, 1}, {1, 1}), (Shape{2, 1}));
  // Zero-size dims are laid out as size 1, as torch does.
  EXPECT_EQ(global_stride_like({0, 3}, {0, 3}, {3, 1}), strides_of(at::empty({0, 3})));
  EXPECT_EQ(global_stride_like({}, {}, {}), (Shape{}));
}

TEST(Numel, ProductOfSizes) {
  EXPECT_EQ(numel({}), 1);  // a 0-d tensor holds one element
  EXPECT_EQ(numel({7}), 7);
  EXPECT_EQ(numel({2, 3, 4}), 24);
  EXPECT_EQ(numel({2, 0, 3}), 0);
}

}  // namespace
}  // namespace dtensor
