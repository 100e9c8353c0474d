#pragma once
// Whether a DTensor's local buffer may be overwritten by the collective that consumes it (an
// all-reduce in place instead of into a copy).

#include <ATen/core/Tensor.h>

namespace dtensor::detail {

// True when overwriting the DTensor's local buffer cannot be observed: this handle is the only one to
// the DTensor (a node that saved it as an input holds another), to its local tensor (DTensor copies
// autograd makes of saved outputs share that) and to the storage (views and from_local's caller share
// that). Nothing can then read the old values, a gradient formula included, so requires_grad does not
// matter: a redistribution's backward needs no values of its input.
bool donatable(const at::Tensor& dtensor);

}  // namespace dtensor::detail
