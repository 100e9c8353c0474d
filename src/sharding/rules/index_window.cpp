#include "index_window.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <string>

#include "dtensor/errors.h"

namespace dtensor::rules {
namespace {

// The host scans read int64 or int32, the index dtypes LibTorch's lookups take; anything else gets
// that said here rather than a dispatch macro's "not implemented for" message.
void require_index_dtype(const at::Tensor& indices) {
  if (indices.scalar_type() != at::kLong && indices.scalar_type() != at::kInt)
    throw DTensorError(std::string("lookup into a row-sharded table (or class-sharded logits): indices must be int64 or "
                                   "int32, as LibTorch's embedding and cross_entropy require; got ") +
                       c10::toString(indices.scalar_type()));
}

}  // namespace

IndexWindow index_window(const at::Tensor& indices, int64_t offset, int64_t size, int64_t elsewhere, int64_t dropped) {
  const int64_t end = offset + size;
  if (!indices.device().is_cpu()) {
    at::Tensor held = (indices >= offset) & (indices < end);
    if (dropped >= offset && dropped < end) held = held & (indices != dropped);
    return {held, at::where(held, indices - offset, elsewhere), false};
  }
  require_index_dtype(indices);
  const at::Tensor source = indices.contiguous();
  at::Tensor held = at::empty(indices.sizes(), indices.options().dtype(at::kBool));
  at::Tensor local_index = at::empty(indices.sizes(), indices.options());
  int64_t held_count = 0;
  AT_DISPATCH_INDEX_TYPES(source.scalar_type(), "index_window", [&] {
    const index_t* in = source.const_data_ptr<index_t>();
    bool* is_held = held.data_ptr<bool>();
    index_t* out = local_index.data_ptr<index_t>();
    for (int64_t i = 0, n = source.numel(); i < n; ++i) {
      const int64_t index = in[i];
      is_held[i] = index >= offset && index < end && index != dropped;
      out[i] = static_cast<index_t>(is_held[i] ? index - offset : elsewhere);
      held_count += is_held[i];
    }
  });
  return {held, local_index, held_count == indices.numel()};
}

FormIndexWindow index_window_form(GraphFormBuilder& b, FormValue indices, int64_t offset, int64_t size, int64_t elsewhere,
                                  int64_t dropped) {
  FormValue held = b.op("aten::logical_and", {b.op("aten::ge.Scalar", {indices, offset}, "from_lo"),
                                              b.op("aten::lt.Scalar", {indices, offset + size}, "below_hi")},
                        "held");
  if (dropped >= offset && dropped < offset + size)
    held = b.op("aten::logical_and", {held, b.op("aten::ne.Scalar", {indices, dropped}, "not_dropped")}, "held_not_dropped");
  const FormValue shifted = b.op("aten::sub.Scalar", {indices, offset}, "local_index");
  return {held, b.op("aten::where.ScalarOther", {held, shifted, elsewhere}, "held_index")};
}

std::optional<int64_t> first_index_outside(const at::Tensor& indices, int64_t rows, std::optional<int64_t> ignored) {
  if (!indices.device().is_cpu()) {  // read back to the host: the caller needs the answer now
    at::Tensor outside = indices.lt(0).logical_or(indices.ge(rows));
    if (ignored) outside = outside.logical_and(indices.ne(*ignored));
    if (!outside.any().item<bool>()) return std::nullopt;
    return indices.masked_select(outside)[0].item<int64_t>();
  }
  require_index_dtype(indices);
  const at::Tensor source = indices.contiguous();
  std::optional<int64_t> found;
  AT_DISPATCH_INDEX_TYPES(source.scalar_type(), "first_index_outside", [&] {
    const index_t* in = source.const_data_ptr<index_t>();
    for (int64_t i = 0, n = source.numel(); i < n && !found; ++i)
      if ((in[i] < 0 || in[i] >= rows) && in[i] != ignored) found = in[i];
  });
  return found;
}

}  // namespace dtensor::rules
