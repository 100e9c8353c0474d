#pragma once
// Packing the pieces of an all-to-all into the one contiguous send buffer c10d's all_to_all_single
// takes (Gloo's only all-to-all, and MPI's when its members do not share memory).

#include <ATen/core/Tensor.h>

#include <vector>

namespace dtensor::detail {

// The pieces (any strides), flattened, back to back in member order in one new contiguous tensor.
at::Tensor packed_back_to_back(const std::vector<at::Tensor>& pieces);

}  // namespace dtensor::detail
