#pragma once
// The one check for "is this tensor a DTensor", for code that asks it of every argument of every op
// (dispatch) as well as for is_dtensor / dtensor_impl; and the one way ops wrap their results.

#include <ATen/core/Tensor.h>

#include <memory>

namespace dtensor {
class DTensorImpl;
struct DTensorSpec;
}

namespace dtensor::detail {

// The DTensorImpl behind `t`, or null for a plain or undefined tensor.
const DTensorImpl* as_dtensor(const at::Tensor& t);

// An op's result `local` (this rank's shard, laid out as `spec` says) as a DTensor. A result held by
// nothing else and without autograd metadata (ops run below autograd) is wrapped as it is; anything
// else (an input returned as its own result, a tensor some rule keeps) gets its own TensorImpl first,
// as make_dtensor gives it, so that an in-place view of one DTensor's local tensor never reshapes
// another's.
at::Tensor wrap_local(at::Tensor local, std::shared_ptr<const DTensorSpec> spec);

// Has `action` run once, just before the first DTensor is made. The sharding layer routes ops to its
// dispatch this way: only then is every library's op in the dispatcher, and the tensor layer needs
// no knowledge of sharding. Call during static initialisation.
void before_first_dtensor(void (*action)());

}  // namespace dtensor::detail
