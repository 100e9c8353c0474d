#include "dtensor/layout.h"

#include <algorithm>
#include <numeric>

#include "dtensor/errors.h"

namespace dtensor {

int64_t padded_chunk_size(int64_t length, int64_t num_chunks) { return (length + num_chunks - 1) / num_chunks; }

ChunkExtent chunk_extent(int64_t length, int64_t num_chunks, int64_t index) {
  const int64_t chunk = padded_chunk_size(length, num_chunks);
  const int64_t offset = std::min(length, chunk * index);
  return {std::min(length, offset + chunk) - offset, offset};
}

ChunkExtent strided_block_chunk(int64_t length, int64_t split_factor, int64_t num_chunks, int64_t index) {
  if (length % split_factor != 0)
    throw DTensorError("StridedShard with split factor " + std::to_string(split_factor) + " needs a dim of whole " +
                       "blocks, but the dim has " + std::to_string(length) + " elements; redistribute to Shard or " +
                       "Replicate instead");
  return chunk_extent(length / split_factor, num_chunks, index);
}

LocalLayout local_layout(const Shape& global_shape, const Shape& mesh_shape, const Shape& coordinate,
                         const Placements& placements) {
  LocalLayout out{global_shape, Shape(global_shape.size(), 0)};
  for (size_t m = 0; m < placements.size(); ++m) {
    if (placements[m].is_multi_run_shard())
      throw DTensorError("placements (" + to_string(placements) + ") hold a " +
                         (placements[m].is_head_tail_shard() ? "head-tail" : "strided") + " shard, which is several runs of " +
                         "the global tensor rather than one block; redistribute it to Shard or Replicate first");
    if (!placements[m].is_shard()) continue;
    const auto d = static_cast<size_t>(placements[m].dim());
    const ChunkExtent c = chunk_extent(out.shape[d], mesh_shape[m], coordinate[m]);
    out.shape[d] = c.size;
    out.offset[d] += c.offset;
  }
  return out;
}

int64_t sharded_size(const Placement& sharding, int64_t length, int64_t num_chunks, int64_t index) {
  if (sharding.is_shard()) return chunk_extent(length, num_chunks, index).size;
  if (sharding.is_head_tail_shard()) {
    // Two of 2n equal chunks. Dispatch asks this for every output: the error's text is made only when
    // the chunks are not whole (sequence_runs refuses them, naming the placement).
    if (length % (2 * num_chunks) != 0) sequence_runs(length, num_chunks, index, true, sharding.str() + " over " + std::to_string(num_chunks) + " ranks");
    return length / num_chunks;
  }
  const int64_t blocks = sharding.split_factor();
  return blocks * strided_block_chunk(length, blocks, num_chunks, index).size;
}

Shape local_shape(const Shape& global_shape, const Shape& mesh_shape, const Shape& coordinate,
                  const Placements& placements) {
  Shape out = global_shape;
  for (size_t m = 0; m < placements.size(); ++m) {
    const Placement& p = placements[m];
    if (!p.is_sharding()) continue;
    const auto d = static_cast<size_t>(p.dim());
    out[d] = sharded_size(p, out[d], mesh_shape[m], coordinate[m]);
  }
  return out;
}

namespace {
// Reductions over several mesh dims run innermost first; they commute only when they are all linear
// (sum/avg) or all the same max/min.
bool partials_commute(const Placements& placements) {
  bool linear = false, max = false, min = false;
  for (const auto& p : placements) {
    if (!p.is_partial()) continue;
    linear |= p.reduce_op() == ReduceOp::Sum || p.reduce_op() == ReduceOp::Avg;
    max |= p.reduce_op() == ReduceOp::Max;
    min |= p.reduce_op() == ReduceOp::Min;
  }
  return int(linear) + int(max) + int(min) <= 1;
}
}  // namespace

namespace {

// Why normalised placements cannot hold together: a strided shard's dim sharded by another mesh dim
// too (its blocks would be cut twice), or Partial reductions whose order would matter.
enum class Conflict { None, StridedDimSharedWith, PartialsMixed };

Conflict conflict_of(const Placements& placements, int64_t* dim) {
  for (size_t m = 0; m < placements.size(); ++m) {
    if (!placements[m].is_multi_run_shard()) continue;
    for (size_t k = 0; k < placements.size(); ++k)
      if (k != m && placements[k].is_sharding() && placements[k].dim() == placements[m].dim()) {
        *dim = placements[m].dim();
        return Conflict::StridedDimSharedWith;
      }
  }
  return partials_commute(placements) ? Conflict::None : Conflict::PartialsMixed;
}

}  // namespace

Placements validate_placements(const Placements& placements, int64_t mesh_ndim, int64_t tensor_ndim,
                               const char* what) {
  if (static_cast<int64_t>(placements.size()) != mesh_ndim) {
    throw DTensorError(std::string(what) + ": got " + std::to_string(placements.size()) + " placement(s) (" +
                       to_string(placements) + ") for a mesh with " + std::to_string(mesh_ndim) +
                       " dimension(s); give exactly one placement per mesh dimension");
  }
  Placements out;
  out.reserve(placements.size());
  for (const auto& p : placements) {
    try {
      out.push_back(p.normalized(tensor_ndim));
    } catch (const DTensorError& e) {
      throw DTensorError(std::string(what) + ": placements (" + to_string(placements) + "): " +
                         std::string(e.what()).substr(9));
    }
  }
  int64_t dim = 0;
  switch (conflict_of(out, &dim)) {
    case Conflict::None: break;
    case Conflict::StridedDimSharedWith:
      throw DTensorError(std::string(what) + ": placements (" + to_string(placements) + ") shard dim " + std::to_string(dim) +
                         " by a strided or head-tail shard and by another mesh dim; such a " +
                         "shard must be the only sharding of its dim (redistribute one of them to Replicate)");
    case Conflict::PartialsMixed:
      throw DTensorError(std::string(what) + ": placements (" + to_string(placements) +
                         ") mix Partial reduce ops whose result depends on reduction order; reduce one of them "
                         "first (redistribute that mesh dim to Replicate)");
  }
  return out;
}

bool placements_fit(const Placements& placements, int64_t mesh_ndim, int64_t tensor_ndim) {
  if (static_cast<int64_t>(placements.size()) != mesh_ndim) return false;
  for (const Placement& p : placements)
    if (p.is_sharding() && (p.dim() < 0 || p.dim() >= tensor_ndim)) return false;
  int64_t dim = 0;
  return conflict_of(placements, &dim) == Conflict::None;
}

Shape global_shape_assuming_even(const Shape& local_shape, const Shape& mesh_shape, const Placements& placements) {
  Shape out = local_shape;
  for (size_t m = 0; m < placements.size(); ++m) {
    if (placements[m].is_sharding()) out[static_cast<size_t>(placements[m].dim())] *= mesh_shape[m];
  }
  return out;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<int64_t>(shape[i], 1);
  return strides;
}

Shape global_stride_like(const Shape& global_shape, const Shape& local_shape, const Shape& local_stride) {
  // Order dims from outermost (largest stride) to innermost, ties keep the natural order, then lay the
  // global shape out densely in that order.
  std::vector<size_t> order(local_shape.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return local_stride[a] > local_stride[b]; });
  Shape strides(global_shape.size(), 1);
  int64_t running = 1;
  for (size_t i = order.size(); i-- > 0;) {
    strides[order[i]] = running;
    running *= std::max<int64_t>(global_shape[order[i]], 1);
  }
  return strides;
}

int64_t numel(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

}  // namespace dtensor
