#pragma once
// Tensors laid out [N, C, *spatial], as convolutions and the norms take them: per-channel values
// broadcast over them, and the dims a per-channel statistic sums over.

#include <ATen/ATen.h>

#include <vector>

namespace dtensor::rules {

// [1, -1, 1, ...]: the shape that broadcasts a per-channel tensor over a [N, C, *spatial] one of
// `ndim` dims.
inline std::vector<int64_t> per_channel_shape(int64_t ndim) {
  std::vector<int64_t> shape(ndim, 1);
  shape[1] = -1;
  return shape;
}

inline at::Tensor per_channel(const at::Tensor& t, int64_t ndim) { return t.view(per_channel_shape(ndim)); }

// The dims of a [N, C, *spatial] tensor other than the channels.
inline std::vector<int64_t> all_but_channels(int64_t ndim) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < ndim; ++d) dims.push_back(d);
  return dims;
}

}  // namespace dtensor::rules
