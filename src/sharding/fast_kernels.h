#pragma once
// Unboxed kernels for t (which every Linear runs about five times a step, forward and backward) and
// detach (autograd's, for every gradient it accumulates): the same propagation, cache and result as
// the general kernel (dispatch.h), without boxing the call, scanning its arguments or dispatching the
// shard's op boxed. Calls the fast path does not take go to the general kernel. (view and _unsafe_view
// are as frequent, but their rule checks on the shard that the view needs no copy: they keep the
// general kernel.)

#include <string>

namespace torch {
class Library;
}

namespace dtensor::detail {

// Registers the fast kernel for `qualified` (e.g. "aten::t") in `library` (dtensor's PrivateUse2
// library for the op's namespace); false when the op has none.
bool register_fast_kernel(torch::Library& library, const std::string& qualified);

}  // namespace dtensor::detail
