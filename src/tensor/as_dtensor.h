#pragma once
// The one check for "is this tensor a DTensor", for code that asks it of every argument of every op
// (dispatch) as well as for is_dtensor / dtensor_impl.

#include <ATen/core/Tensor.h>

namespace dtensor {
class DTensorImpl;
}

namespace dtensor::detail {

// The DTensorImpl behind `t`, or null for a plain or undefined tensor.
const DTensorImpl* as_dtensor(const at::Tensor& t);

}  // namespace dtensor::detail
