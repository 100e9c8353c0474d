// Ordinary LibTorch code on DTensors: a Megatron-style MLP block written with torch::nn::functional
// (column-sharded first layer, row-sharded second, layer norm, cross-entropy), forward and backward,
// against the same code on one device.

#include <ATen/core/grad_mode.h>
#include <torch/nn/functional.h>

#include "dtensor/comm_debug.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

namespace F = torch::nn::functional;

struct Weights {
  at::Tensor w1, b1, w2, b2, gamma, beta;
};

// logits = W2 relu(W1 layer_norm(x) + b1) + b2; loss = cross_entropy(logits, target)
at::Tensor mlp_loss(const Weights& w, const at::Tensor& x, const at::Tensor& target) {
  at::Tensor h = F::layer_norm(x, F::LayerNormFuncOptions({x.size(-1)}).weight(w.gamma).bias(w.beta));
  h = F::relu(F::linear(h, w.w1, w.b1));
  return F::cross_entropy(F::linear(h, w.w2, w.b2), target);
}

class FunctionalTest : public DistTest {};

TEST_F(FunctionalTest, MegatronMlpWithTorchFunctional) {
  auto m = mesh({4});
  const int64_t batch = 5, hidden = 6, ffn = 10, classes = 3;
  Weights full{test_tensor({ffn, hidden}, at::kDouble, 1) / 8, test_tensor({ffn}, at::kDouble, 2) / 8,
               test_tensor({classes, ffn}, at::kDouble, 3) / 8, test_tensor({classes}, at::kDouble, 4) / 8,
               test_tensor({hidden}, at::kDouble, 5) / 8 + 1, test_tensor({hidden}, at::kDouble, 6) / 8};
  for (auto* t : {&full.w1, &full.b1, &full.w2, &full.b2, &full.gamma, &full.beta}) t->requires_grad_();
  const at::Tensor x = test_tensor({batch, hidden}, at::kDouble, 7) / 4;
  const at::Tensor target = at::tensor({0, 2, 1, 1, 0}, at::kLong);

  // Column-parallel first layer (weight and bias Shard(0)), row-parallel second (weight Shard(1)).
  auto param = [&](const at::Tensor& t, Placements p) { return distribute_tensor(t.detach().clone().requires_grad_(), m, p); };
  Weights dist{param(full.w1, {Shard(0)}), param(full.b1, {Shard(0)}), param(full.w2, {Shard(1)}),
               param(full.b2, {Replicate()}), param(full.gamma, {Replicate()}), param(full.beta, {Replicate()})};
  const at::Tensor dx = distribute_tensor(x, m), dtarget = distribute_tensor(target, m);

  CommDebugMode debug;
  at::Tensor loss = mlp_loss(dist, dx, dtarget);
  // The Megatron pattern: the row-parallel layer's partial sums meet in one all-reduce.
  EXPECT_EQ(debug.count("all-reduce"), 1) << debug.summary();
  EXPECT_EQ(debug.count("all-gather"), 0) << debug.summary();

  const at::Tensor expected = mlp_loss(full, x, target);
  EXPECT_TRUE(tensors_close(full_tensor(loss), expected, 1e-10, 1e-12));
  loss.backward();
  expected.backward();
  at::NoGradGuard no_grad;
  const std::vector<std::pair<at::Tensor, at::Tensor>> grads = {{dist.w1, full.w1}, {dist.b1, full.b1}, {dist.w2, full.w2},
                                                                {dist.b2, full.b2}, {dist.gamma, full.gamma}, {dist.beta, full.beta}};
  for (const auto& [d, f] : grads) EXPECT_TRUE(tensors_close(full_tensor(d.grad()), f.grad(), 1e-10, 1e-12));
  // The column-parallel weight's gradient stays sharded like the weight. (The row-parallel one comes
  // out Partial(sum) here, reduced to Shard(1) where the optimizer needs it.)
  EXPECT_EQ(placements_of(dist.w1.grad()), (Placements{Shard(0)}));
}

}  // namespace
}  // namespace dtensor::testing
