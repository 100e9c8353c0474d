#pragma once
// A value's tensor on the Meta device: its shape, strides and dtype, no data (what sharding
// propagation and reshard planning read).

#include <ATen/core/Tensor.h>

#include "dtensor/graph/ir.h"

namespace dtensor::graph::detail {

at::Tensor meta_tensor(const Value& v);

}  // namespace dtensor::graph::detail
