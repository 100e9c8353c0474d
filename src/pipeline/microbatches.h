#pragma once
// A batch split into a schedule's microbatches along dim 0, as PyTorch's pipelining splits it
// (torch.tensor_split): a batch of 10 in 4 makes 3, 3, 2, 2.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace dtensor::pipeline::detail {

// Refuses (naming `what`) a tensor without a dim 0 or with fewer rows than microbatches.
std::vector<at::Tensor> split_microbatches(const at::Tensor& batch, int num_microbatches, const std::string& what);

}  // namespace dtensor::pipeline::detail
