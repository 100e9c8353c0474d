#pragma once
// Lookups into a row-sharded table (Shard(0): the vocabulary split over ranks, uneven sizes allowed),
// shared by embedding and embedding_bag: each rank looks up only the indices in its row range, and
// computes the gradient of its rows only.

#include <ATen/ATen.h>

#include <string>

#include "dtensor/errors.h"
#include "index_window.h"
#include "rule_helpers.h"

namespace dtensor::rules {

// Indices outside the table would be silently masked away by a row-sharded lookup; fail as the
// single-device op does instead.
inline void check_indices(const at::Tensor& indices, int64_t rows, const char* op) {
  auto message = [&] { return std::string(op) + ": an index lies outside the table's " + std::to_string(rows) + " rows"; };
  if (indices.device().is_cpu()) {
    if (first_index_outside(indices, rows)) throw DTensorError(message());
    return;
  }
  if (indices.numel() > 0) check_on_device(((indices >= 0) & (indices < rows)).all(), message());
}

// This rank's rows [offset, offset + size) of a table of `shape` laid out as `placements`.
inline ChunkExtent held_rows(const OpSchema& s, const Shape& shape, const Placements& placements) {
  const LocalLayout part = local_part(s, shape, placements);
  return {part.shape[0], part.offset[0]};
}

// Which indices fall in `rows` (padding_idx counting as not held), and their positions there (0 where
// they do not).
inline IndexWindow look_up_rows(const at::Tensor& indices, ChunkExtent rows, int64_t padding_idx = -1) {
  return index_window(indices, rows.offset, rows.size, /*elsewhere=*/0, /*dropped=*/padding_idx);
}

// The gradient of rows [offset, offset + size) of the table: the rows of `grad` ([..., D], one per
// index) whose index falls there (and is not padding_idx) are added up, each scaled by
// 1 / (occurrences of its index) when scale_by_frequency. It is LibTorch's own backward over the
// indices moved into the window, with every other index (and padding_idx) sent to one extra row that
// is the padding row, so skipped; the counts of held indices are unchanged by the move.
inline at::Tensor rows_gradient(const at::Tensor& grad, const at::Tensor& indices, ChunkExtent rows, int64_t padding_idx,
                                bool scale_by_frequency) {
  if (rows.size == 0) return at::zeros({0, grad.size(-1)}, grad.options());
  const IndexWindow window = index_window(indices, rows.offset, rows.size, /*elsewhere=*/rows.size, padding_idx);
  return at::embedding_dense_backward(grad, window.local_index, rows.size + 1, rows.size, scale_by_frequency)
      .narrow(0, 0, rows.size);
}

// rows_gradient as graph ops.
inline FormValue rows_gradient_form(GraphFormBuilder& b, FormValue grad, FormValue indices, ChunkExtent rows, int64_t width,
                                    int64_t padding_idx, const c10::IValue& scale_by_frequency) {
  if (rows.size == 0) return b.op("aten::new_zeros", {grad, std::vector<int64_t>{0, width}}, "no_rows");
  const FormIndexWindow window = index_window_form(b, indices, rows.offset, rows.size, /*elsewhere=*/rows.size, padding_idx);
  const FormValue all = b.op("aten::embedding_dense_backward", {grad, window.local_index, rows.size + 1, rows.size, scale_by_frequency},
                             "rows_and_elsewhere");
  return b.op("aten::slice.Tensor", {all, int64_t{0}, int64_t{0}, rows.size}, "rows_gradient");
}

// check_indices as a graph op: an assertion, which graph programs keep and eager dispatch raises.
inline void check_indices_form(GraphFormBuilder& b, FormValue indices, int64_t rows, const char* op) {
  const FormValue inside = b.op("aten::logical_and", {b.op("aten::ge.Scalar", {indices, int64_t{0}}, "not_negative"),
                                                      b.op("aten::lt.Scalar", {indices, rows}, "below_rows")},
                                "inside");
  b.op("aten::_assert_async.msg", {b.op("aten::all", {inside}, "all_inside"),
                                   c10::IValue(std::string(op) + ": an index lies outside the table's " + std::to_string(rows) + " rows")},
       "indices_inside");
}

}  // namespace dtensor::rules
