#pragma once
// Small torch::nn modules and checks shared by the module tests.

#include <torch/nn/modules/linear.h>

#include "dtensor/module.h"
#include "harness.h"

namespace dtensor::testing {

// Two Linear layers with a ReLU between, calling them through dtensor::call.
class TwoLayerImpl : public torch::nn::Module {
 public:
  TwoLayerImpl(int64_t dim, int64_t hidden)
      : up(register_module("up", torch::nn::Linear(dim, hidden))),
        down(register_module("down", torch::nn::Linear(hidden, dim))) {}
  at::Tensor forward(const at::Tensor& x) { return call(down, at::relu(call(up, x))); }
  torch::nn::Linear up, down;
};
TORCH_MODULE(TwoLayer);

// A module built the same way (same seed) on every rank, in double precision.
template <typename M, typename... Args>
M seeded(Args... args) {
  torch::manual_seed(7);
  M m(args...);
  m->to(at::kDouble);
  return m;
}

// Every parameter's gradient equals the reference module's, and a DTensor's is laid out like it.
inline void expect_grads_equal(torch::nn::Module& parallel, torch::nn::Module& reference, double rtol = 1e-10,
                               double atol = 1e-12) {
  const auto expected = reference.named_parameters();
  for (const auto& p : parallel.named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    const at::Tensor grad = is_dtensor(p.value()) ? full_tensor(p.value().grad()) : p.value().grad();
    EXPECT_TRUE(tensors_close(grad, expected[p.key()].grad(), rtol, atol)) << p.key();
    if (is_dtensor(p.value())) {
      EXPECT_EQ(placements_of(p.value().grad()), placements_of(p.value())) << p.key();
    }
  }
}

}  // namespace dtensor::testing
