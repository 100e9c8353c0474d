#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include "dtensor/dtensor_impl.h"
#include "dtensor/module.h"

namespace dtensor::detail {

at::Tensor forward_linear(torch::nn::LinearImpl& linear, const at::Tensor& input) {
  if (!is_dtensor(linear.weight)) return linear.forward(input);
  return at::linear(input, linear.weight, linear.bias.defined() ? std::optional<at::Tensor>(linear.bias) : std::nullopt);
}

}  // namespace dtensor::detail
