#pragma once
// The oracle for StridedShard layouts, shared by the unit and distributed tests: built from
// torch.chunk alone, independent of dtensor's layout code.

#include <ATen/ATen.h>

#include <vector>

namespace dtensor::testing {

// Rank q's piece of `full` under StridedShard(dim, blocks) over `ranks`: torch.chunk piece q of each
// block, joined along the dim.
inline at::Tensor strided_piece(const at::Tensor& full, int64_t dim, int64_t blocks, int64_t ranks, int64_t q) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& block : full.chunk(blocks, dim)) {
    const auto chunks = block.chunk(ranks, dim);
    parts.push_back(q < static_cast<int64_t>(chunks.size()) ? chunks[q] : block.narrow(dim, 0, 0));
  }
  return at::cat(parts, dim);
}

}  // namespace dtensor::testing
