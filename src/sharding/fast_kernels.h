#pragma once
// Unboxed kernels for the one-tensor view ops a Linear layer runs several times a step, forward and
// backward (t, view, _unsafe_view, and detach when autograd accumulates a gradient): the same
// propagation, cache and result as the general kernel (dispatch.h), without boxing the call, scanning
// its arguments or dispatching the shard's op boxed. Calls the fast path does not take go to the
// general kernel.

#include <string>

namespace torch {
class Library;
}

namespace dtensor::detail {

// Registers the fast kernel for `qualified` (e.g. "aten::t") in `library` (dtensor's PrivateUse2
// library for the op's namespace); false when the op has none.
bool register_fast_kernel(torch::Library& library, const std::string& qualified);

}  // namespace dtensor::detail
