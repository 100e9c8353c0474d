// A backward split into input (I) and weight (W) halves (src/pipeline/split_backward.h), against one
// whole backward of the same graph: the input's gradient after I, every parameter's after W (a weight
// used twice, a residual around a layer, a parameter the output does not read), and W running only the
// parameters' side: a node on the input's path runs its backward once, in I.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include "../../src/pipeline/split_backward.h"

namespace dtensor::pipeline::detail {
namespace {

// tanh whose backward counts its calls.
struct CountingTanh : public torch::autograd::Function<CountingTanh> {
  static inline int backward_calls = 0;
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    const at::Tensor y = at::tanh(x);
    ctx->save_for_backward({y});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    ++backward_calls;
    const at::Tensor y = ctx->get_saved_variables()[0];
    return {grads[0] * (1 - y * y)};
  }
};

struct Net {
  at::Tensor w1, b1, w2, w3, unused;
  Net() {
    const auto values = [](int64_t rows, int64_t cols, double scale) {
      return at::sin(at::arange(rows * cols, at::kDouble).mul(scale)).reshape({rows, cols}).requires_grad_(true);
    };
    w1 = values(5, 4, 0.3), b1 = values(1, 5, 0.7).view({5}).detach().requires_grad_(true), w2 = values(5, 5, 0.11);
    w3 = values(4, 5, 0.19), unused = values(2, 2, 0.5);
  }
  std::vector<at::Tensor> parameters() const { return {w1, b1, w2, w3, unused}; }
  // x [3, 4] -> [3, 4]: w1 again in the last layer (tied, transposed), a residual around w2's layer.
  at::Tensor forward(const at::Tensor& x) const {
    const at::Tensor h = CountingTanh::apply(at::linear(x, w1, b1));
    const at::Tensor r = h + at::tanh(at::linear(h, w2));
    return at::linear(r, w3) + at::linear(at::linear(x, w1), w1.t()).mul(0.5);
  }
};

TEST(SplitBackwardTest, InputThenWeightsEqualOneBackwardAndWeightsSkipTheInputsPath) {
  const at::Tensor x_values = at::cos(at::arange(12, at::kDouble).mul(0.4)).reshape({3, 4});
  const at::Tensor output_grad = at::sin(at::arange(12, at::kDouble).mul(0.9)).reshape({3, 4});

  Net reference;
  const at::Tensor x_reference = x_values.clone().requires_grad_(true);
  reference.forward(x_reference).backward(output_grad);

  Net net;
  const at::Tensor x = x_values.clone().requires_grad_(true);
  at::Tensor output = net.forward(x);
  CountingTanh::backward_calls = 0;
  auto [input_grad, weights] = backward_input(output, output_grad, x, net.parameters());
  output = at::Tensor();
  EXPECT_TRUE(at::allclose(input_grad, x_reference.grad(), 1e-12, 1e-12));
  for (const at::Tensor& p : net.parameters()) EXPECT_FALSE(p.grad().defined()) << "a parameter's gradient before W";
  EXPECT_EQ(CountingTanh::backward_calls, 1);

  weights.run();
  EXPECT_EQ(CountingTanh::backward_calls, 1) << "W ran the input's path again";
  const std::vector<at::Tensor> expected = reference.parameters(), got = net.parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].grad().defined(), expected[i].grad().defined()) << "parameter " << i;
    if (got[i].grad().defined()) EXPECT_TRUE(at::allclose(got[i].grad(), expected[i].grad(), 1e-12, 1e-12)) << "parameter " << i;
  }
  EXPECT_FALSE(net.unused.grad().defined());
}

}  // namespace
}  // namespace dtensor::pipeline::detail
