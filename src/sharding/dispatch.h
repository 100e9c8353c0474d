#pragma once
// The general kernel every covered aten op on a DTensor runs (fast_kernels.h has unboxed shortcuts for
// t and detach, which fall back to it): OpSchema -> propagation -> redistribute inputs -> the op on
// local shards -> outputs wrapped as DTensors.

#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

#include "dtensor/op_schema.h"
#include "propagation.h"

namespace dtensor::detail {

void dispatch_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

// The kernel of an op without a rule whose ATen implementation is composite (CompositeExplicitAutograd:
// written in terms of other aten ops): tells CommDebugMode and the redistribution log, then runs that
// implementation on the DTensors, so that its constituent ops propagate and redistribute with their
// own rules. A rule registered for the op later takes over.
void composite_fallback_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

// Tells an active CommDebugMode that `op` ran on DTensors placed as `inputs` are.
void record_op_for_debug(const c10::OperatorHandle& op, const std::vector<TensorInput>& inputs);

// The spec of output `k` of a cached decision (whose specs hold no mesh) for this call's mesh. An output
// laid out like one of the inputs (pointwise ops, detach, in-place results) shares that input's spec
// instead of a new one.
SpecPtr output_spec(const CachedDecision& cached, size_t k, const MeshPtr& mesh, const std::vector<TensorInput>& inputs);

}  // namespace dtensor::detail
