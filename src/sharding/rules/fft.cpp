// The FFT kernels that torch.fft's functions become (_fft_r2c, _fft_c2c, _fft_c2r): each transforms the
// dims listed in `dim`, which stay whole, and treats every index of the other dims on its own, so
// those shard in and out alike. The transforms are linear: Partial sums pass through.

#include "../registry.h"
#include "optional_tensors.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

std::vector<DimStrategy> fft(const OpSchema& s) {
  const int64_t ndim = s.input_ndim(0);
  std::vector<bool> transformed(static_cast<size_t>(ndim), false);
  for (const int64_t d : argument(s, "dim").toIntVector()) transformed[static_cast<size_t>(wrap_dim(d, ndim))] = true;
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < ndim; ++d)
    if (!transformed[static_cast<size_t>(d)]) out.push_back({{Shard(d)}, {Shard(d)}});
  for (ReduceOp op : linear_reduce_ops(s)) out.push_back({{Partial(op)}, {Partial(op)}});
  return out;
}

const bool fft_rules_registered = [] {
  detail::register_family({"aten::_fft_r2c", "aten::_fft_c2c", "aten::_fft_c2r"}, {.dim = fft, .family = "fft"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
