#pragma once
// Pure layout math over index boxes: which box of a global tensor each rank of a mesh holds, where two
// layouts overlap, and which contiguous runs of a row-major piece a box covers. The checkpoint loader
// (saved pieces -> this rank's shard) and cross-mesh redistribution (one mesh's shards -> another's)
// plan with these same functions.

#include <cstdint>
#include <optional>
#include <vector>

#include "dtensor/layout.h"

namespace dtensor {

// The elements offset[d] <= i[d] < offset[d] + shape[d] of a tensor.
struct Box {
  Shape offset;
  Shape shape;

  bool empty() const;
  bool operator==(const Box& o) const { return offset == o.offset && shape == o.shape; }
};

// Where `a` and `b` overlap, or nothing when they do not (or the overlap is empty).
std::optional<Box> intersect(const Box& a, const Box& b);

// One distinct box of a laid-out tensor and the global ranks holding it (several for Replicate or
// Partial mesh dims), in the mesh's row-major order. Empty boxes (uneven shards past the end) are left out.
struct Piece {
  Box box;
  std::vector<int64_t> holders;
};

// Every piece of a tensor of `global_shape` laid out with `placements` on a mesh of `mesh_shape`
// whose row-major ranks are `mesh_ranks`, in the order of their first holder.
std::vector<Piece> pieces_of(const Shape& global_shape, const Shape& mesh_shape, const std::vector<int64_t>& mesh_ranks,
                             const Placements& placements);

// A contiguous run of elements shared by a row-major piece and a row-major buffer holding `part`.
struct ContiguousRun {
  int64_t piece_offset;  // elements from the piece's first element
  int64_t part_offset;   // elements from the part buffer's first element
  int64_t length;        // elements
};

// The runs that copy `part` (inside `piece`, both in global coordinates) out of the piece: as few and
// as long as the row-major order allows (dims `part` covers whole are merged into one run).
std::vector<ContiguousRun> runs_within(const Box& piece, const Box& part);

}  // namespace dtensor
