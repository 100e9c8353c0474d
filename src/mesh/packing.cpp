#include "packing.h"

#include <ATen/ATen.h>

#include <cstring>

namespace dtensor::detail {

at::Tensor as_real(const at::Tensor& t) { return t.is_complex() ? at::view_as_real(t) : t; }

namespace {

// Shorter rows go through ATen's loop, which beats a memcpy call per row of a few elements.
constexpr size_t kMinRowBytes = 64;

// `t` as rows of contiguous elements a fixed stride apart: {rows, row_elements, row_stride}, after
// merging every pair of adjacent dims that lie back to back. Rows is 0 when the layout is not that.
struct Rows {
  int64_t rows = 0, row_elements = 0, row_stride = 0;
};

Rows as_rows(const at::Tensor& t) {
  int64_t inner = 1, rows = 1, row_stride = 0;
  int64_t d = t.dim() - 1;
  for (; d >= 0 && (t.size(d) == 1 || t.stride(d) == inner); --d) inner *= t.size(d);  // the contiguous run
  for (; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (rows > 1 && t.stride(d) != row_stride * rows) return {};  // a second level of spacing
    if (rows == 1) row_stride = t.stride(d);
    rows *= t.size(d);
  }
  return {rows, inner, rows == 1 ? inner : row_stride};
}

}  // namespace

void copy_to_bytes(const at::Tensor& src, void* dst) {
  if (src.numel() == 0) return;
  const Rows layout = as_rows(src);
  const auto element = static_cast<size_t>(src.element_size());
  const size_t row_bytes = static_cast<size_t>(layout.row_elements) * element;
  if (layout.rows == 0 || (layout.rows > 1 && row_bytes < kMinRowBytes)) {
    at::from_blob(dst, src.sizes(), src.options()).copy_(src);
    return;
  }
  const size_t stride_bytes = static_cast<size_t>(layout.row_stride) * element;
  const char* from = static_cast<const char*>(src.const_data_ptr());
  char* to = static_cast<char*>(dst);
  for (int64_t r = 0; r < layout.rows; ++r, from += stride_bytes, to += row_bytes) std::memcpy(to, from, row_bytes);
}

std::optional<at::Tensor> back_to_back(const std::vector<at::Tensor>& parts) {
  int64_t elements = 0;
  for (const at::Tensor& part : parts) {
    if (!part.is_contiguous() || !part.storage().is_alias_of(parts[0].storage()) ||
        part.storage_offset() != parts[0].storage_offset() + elements)
      return std::nullopt;
    elements += part.numel();
  }
  return parts[0].as_strided({elements}, {1});
}

at::Tensor packed_back_to_back(const std::vector<at::Tensor>& pieces) {
  if (auto in_place = back_to_back(pieces)) return *in_place;
  int64_t total = 0;
  for (const at::Tensor& piece : pieces) total += piece.numel();
  at::Tensor packed = at::empty({total}, pieces.front().options());
  // One copy per piece, into its place: a whole piece moves as its contiguous runs (its extent along
  // the cut dim times the dims after it), not as the single elements a transpose of that dim would.
  auto* to = static_cast<char*>(packed.data_ptr());
  for (const at::Tensor& piece : pieces) {
    copy_to_bytes(piece, to);
    to += piece.nbytes();
  }
  return packed;
}

}  // namespace dtensor::detail
