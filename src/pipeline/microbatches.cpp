#include "microbatches.h"

#include <ATen/ATen.h>

#include "dtensor/errors.h"

namespace dtensor::pipeline::detail {

std::vector<at::Tensor> split_microbatches(const at::Tensor& batch, int num_microbatches, const std::string& what) {
  if (!batch.defined() || batch.dim() == 0)
    throw DTensorError("pipeline: the " + what + " must be a tensor with a batch dim (dim 0) to split into microbatches");
  if (batch.size(0) < num_microbatches)
    throw DTensorError("pipeline: the " + what + " has " + std::to_string(batch.size(0)) + " rows along dim 0, too few for " +
                       std::to_string(num_microbatches) + " microbatches: give a larger batch or a schedule with fewer microbatches");
  return at::tensor_split(batch, num_microbatches, 0);
}

}  // namespace dtensor::pipeline::detail
