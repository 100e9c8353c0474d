#pragma once
// Tensors laid out [N, C, *spatial], as convolutions and the norms take them: per-channel values
// broadcast over them, and the dims a per-channel statistic sums over.

#include <ATen/ATen.h>

#include <vector>

namespace dtensor::rules {

// [1, C, 1, ...]: a per-channel tensor broadcast over a [N, C, *spatial] one of `ndim` dims.
inline at::Tensor per_channel(const at::Tensor& t, int64_t ndim) {
  std::vector<int64_t> shape(ndim, 1);
  shape[1] = -1;
  return t.view(shape);
}

// The dims of a [N, C, *spatial] tensor other than the channels.
inline std::vector<int64_t> all_but_channels(int64_t ndim) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < ndim; ++d) dims.push_back(d);
  return dims;
}

}  // namespace dtensor::rules
