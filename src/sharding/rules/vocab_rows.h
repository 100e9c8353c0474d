#pragma once
// Lookups into a row-sharded table (Shard(0): the vocabulary split over ranks, uneven sizes allowed),
// shared by embedding and embedding_bag: each rank looks up only the indices in its row range, and
// computes the gradient of its rows only.

#include <ATen/ATen.h>

#include <string>

#include "dtensor/errors.h"
#include "rule_helpers.h"

namespace dtensor::rules {

// Indices outside the table would be silently masked away by a row-sharded lookup; fail as the
// single-device op does instead.
inline void check_indices(const at::Tensor& indices, int64_t rows, const char* op) {
  if (indices.numel() == 0) return;
  check_on_device(((indices >= 0) & (indices < rows)).all(),
                  std::string(op) + ": an index lies outside the table's " + std::to_string(rows) + " rows");
}

// This rank's rows [offset, offset + size) of a table of `shape` laid out as `placements`.
inline ChunkExtent held_rows(const OpSchema& s, const Shape& shape, const Placements& placements) {
  const LocalLayout part = local_part(s, shape, placements);
  return {part.shape[0], part.offset[0]};
}

// Which indices fall in `rows`, and their positions there (0 where they do not).
struct RowLookup {
  at::Tensor held;
  at::Tensor local_index;
};

inline RowLookup look_up_rows(const at::Tensor& indices, ChunkExtent rows) {
  at::Tensor held = (indices >= rows.offset) & (indices < rows.offset + rows.size);
  return {held, at::where(held, indices - rows.offset, 0)};
}

// The gradient of rows [offset, offset + size) of the table: the rows of `grad` ([..., D], one per
// index) whose index falls there (and is not padding_idx) are added up, each scaled by
// 1 / (occurrences of its index) when scale_by_frequency.
inline at::Tensor rows_gradient(const at::Tensor& grad, const at::Tensor& indices, ChunkExtent rows, int64_t num_weights,
                                int64_t padding_idx, bool scale_by_frequency) {
  const int64_t width = grad.size(-1);
  at::Tensor out = at::zeros({rows.size, width}, grad.options());
  if (rows.size == 0) return out;
  const at::Tensor flat_indices = indices.reshape(-1);
  at::Tensor flat_grad = grad.reshape({-1, width});
  if (scale_by_frequency)
    flat_grad = flat_grad / at::bincount(flat_indices, {}, num_weights).index_select(0, flat_indices).unsqueeze(1);
  const RowLookup lookup = look_up_rows(flat_indices, rows);
  const at::Tensor used = lookup.held & (flat_indices != padding_idx);
  return out.index_add_(0, lookup.local_index, at::where(used.unsqueeze(1), flat_grad, 0));
}

}  // namespace dtensor::rules
