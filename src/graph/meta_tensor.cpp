#include "meta_tensor.h"

#include <ATen/ATen.h>

namespace dtensor::graph::detail {

at::Tensor meta_tensor(const Value& v) {
  return at::empty_strided(v.meta.shape, v.meta.stride, at::TensorOptions().dtype(v.meta.dtype).device(at::kMeta));
}

}  // namespace dtensor::graph::detail
