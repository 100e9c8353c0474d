#pragma once
// Pure layout math: which part of a global tensor each rank holds for given placements.
// Follows torch.chunk for uneven sizes: chunk size ceil(n/k), trailing chunks smaller or empty
// (5 over 4 ranks gives 2,2,1,0). A tensor dim sharded over several mesh dims is chunked in
// mesh-dim order (the outer mesh dim first, then each chunk again by the inner one).

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/placement.h"

namespace dtensor {

using Shape = std::vector<int64_t>;

struct ChunkExtent {
  int64_t size;    // elements this chunk holds along the dim
  int64_t offset;  // where it starts in the chunked dim
};

// Chunk `index` of `length` elements split into `num_chunks` torch.chunk pieces.
ChunkExtent chunk_extent(int64_t length, int64_t num_chunks, int64_t index);
// The padded size every chunk is brought to for equal-size collectives: ceil(length / num_chunks).
int64_t padded_chunk_size(int64_t length, int64_t num_chunks);

// A sequence sharded over `ranks` for context parallelism: rank r holds its torch.chunk piece, or, load
// balanced (head_tail, HeadTailShard), chunks r and 2 ranks - 1 - r of 2 ranks equal ones back to back, so that under
// causal attention every rank's queries see as many earlier keys. A rank's block is its torch.chunk
// share in size either way.
struct SequenceRun {
  int64_t chunk;          // orders the runs along the sequence
  int64_t global_offset;  // its first position in the sequence
  int64_t local_offset;   // and in the rank's block
  int64_t size;
};
// The runs rank `rank` holds of `length` positions. Load balanced, a length that is not a multiple of
// 2 ranks is refused with what to do; `where` names the mesh dim in that error.
std::vector<SequenceRun> sequence_runs(int64_t length, int64_t ranks, int64_t rank, bool head_tail, const std::string& where);
// For each position of the sequence, its index among the ranks' blocks laid back to back (rank 0's
// first): the gather that puts such blocks in the sequence's order.
std::vector<int64_t> sequence_order_of_blocks(int64_t length, int64_t ranks, bool head_tail, const std::string& where);

struct LocalLayout {
  Shape shape;   // the local shard's shape
  Shape offset;  // its first element's index in the global tensor
};

// Shape and global offset of the shard held by the rank at `coordinate` of a mesh of `mesh_shape`.
// Placements must already be validated (see validate_placements). Throws for a StridedShard or HeadTailShard, whose
// shard is several runs of the global tensor rather than one box: callers that need the box
// (checkpoints, cross-mesh moves, offsets into a sharded dim) refuse it through this.
LocalLayout local_layout(const Shape& global_shape, const Shape& mesh_shape, const Shape& coordinate,
                         const Placements& placements);

// The local shard's shape alone, for every placement, StridedShard and HeadTailShard included. Throws
// when a StridedShard's dim is not a whole number of its blocks, or a HeadTailShard's of 2n chunks.
Shape local_shape(const Shape& global_shape, const Shape& mesh_shape, const Shape& coordinate,
                  const Placements& placements);

// The piece of each block that the rank at `index` of `num_chunks` holds under StridedShard(d, sf)
// of a dim of `length` elements: chunk `index` of `length / sf`.
ChunkExtent strided_block_chunk(int64_t length, int64_t split_factor, int64_t num_chunks, int64_t index);

// Elements of a dim of `length` that the rank at `index` of `num_chunks` holds under `sharding` (a
// Shard, StridedShard or HeadTailShard).
int64_t sharded_size(const Placement& sharding, int64_t length, int64_t num_chunks, int64_t index);

// Throws DTensorError when placements do not fit: count differs from mesh ndim, Shard dim out of
// range for the tensor, a StridedShard or HeadTailShard dim sharded by another mesh dim too, or Partial reduce ops
// mixed in a way whose result depends on reduction order.
// Returns the placements with negative Shard dims normalised.
Placements validate_placements(const Placements& placements, int64_t mesh_ndim, int64_t tensor_ndim,
                               const char* what);
// Whether validate_placements would accept `placements` unchanged (Shard dims already non-negative),
// without throwing: strategy enumeration tries many combinations that do not fit.
bool placements_fit(const Placements& placements, int64_t mesh_ndim, int64_t tensor_ndim);

// Global shape implied by a local shape when every shard is the full chunk size (the even case):
// each sharded dim multiplied by the mesh sizes sharding it.
Shape global_shape_assuming_even(const Shape& local_shape, const Shape& mesh_shape, const Placements& placements);

// Global strides with the same dimension order (by decreasing local stride) as the local tensor.
Shape global_stride_like(const Shape& global_shape, const Shape& local_shape, const Shape& local_stride);

// Contiguous strides of a shape.
Shape contiguous_strides(const Shape& shape);

int64_t numel(const Shape& shape);

}  // namespace dtensor
