#pragma once
// The one kernel every covered aten op on a DTensor runs: OpSchema -> propagation -> redistribute
// inputs -> the op on local shards -> outputs wrapped as DTensors.

#include <ATen/core/dispatch/Dispatcher.h>

namespace dtensor::detail {

void dispatch_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

}  // namespace dtensor::detail
