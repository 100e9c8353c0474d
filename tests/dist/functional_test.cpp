// Ordinary LibTorch code on DTensors: a Megatron-style MLP block written with torch::nn::functional
// (column-sharded first layer, row-sharded second, layer norm, cross-entropy), forward and backward,
// and an AdamW step in _foreach_* list ops, against the same code on one device.

#include <ATen/core/grad_mode.h>
#include <torch/nn/functional.h>

#include <array>

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

// With the fused CPU kernel turned off, scaled_dot_product_attention runs its math decomposition,
// which builds the causal mask as a plain tensor: heads sharded (5 over the ranks, uneven), forward and
// gradients equal to one device. A plain mask given by the caller is still refused.
TEST_F(FunctionalTest, MathAttentionWithCausalMask) {
  const at::Tensor q = test_tensor({2, 5, 6, 4}, at::kDouble, 1) / 4, k = test_tensor({2, 5, 6, 4}, at::kDouble, 2) / 4;
  const at::Tensor v = test_tensor({2, 5, 6, 4}, at::kDouble, 3), grad = test_tensor({2, 5, 6, 4}, at::kDouble, 4);
  auto& ctx = at::globalContext();
  const bool flash = ctx.userEnabledFlashSDP();
  ctx.setSDPUseFlash(false);
  for (const auto& m : {mesh({4}), mesh({2, 2})}) {
    std::vector<at::Tensor> leaves, dleaves;
    for (const at::Tensor& t : {q, k, v}) {
      leaves.push_back(t.clone().requires_grad_());
      dleaves.push_back(distribute_tensor(t, m, Placements(m->ndim(), Shard(1))).requires_grad_());
    }
    const at::Tensor expected = at::scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], {}, 0.0, /*is_causal=*/true);
    expected.backward(grad);
    const at::Tensor out = at::scaled_dot_product_attention(dleaves[0], dleaves[1], dleaves[2], {}, 0.0, /*is_causal=*/true);
    out.backward(distribute_tensor(grad, m, Placements(m->ndim(), Shard(1))));
    EXPECT_TRUE(tensors_close(full_tensor(out), expected));
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(tensors_close(full_tensor(dleaves[i].grad()), leaves[i].grad())) << "grad " << i;
    const at::Tensor plain_mask = at::ones({6, 6}, at::kBool).tril();
    EXPECT_THROW(at::scaled_dot_product_attention(dleaves[0].detach(), dleaves[1].detach(), dleaves[2].detach(), plain_mask),
                 DTensorError);
  }
  ctx.setSDPUseFlash(flash);
}

// An AdamW step written with the _foreach_* list ops (what PyTorch's optimizers run) on parameters
// sharded in different ways, a 2x2 mesh, uneven shapes: each list element follows its parameter's
// placements, so the step moves nothing, and it equals the same step on one device.
TEST_F(FunctionalTest, ForeachAdamWStepFollowsEachParametersPlacements) {
  auto m = mesh({2, 2});
  const std::vector<Shape> shapes = {{5, 3}, {7}, {3, 6}};
  const std::vector<Placements> placements = {{Shard(0), Shard(1)}, {Replicate(), Shard(0)}, {Shard(1), Replicate()}};
  using State = std::array<std::vector<at::Tensor>, 4>;  // params, grads, exp_avg, exp_avg_sq
  State full, dist;
  for (size_t k = 0; k < shapes.size(); ++k)
    for (size_t j = 0; j < 4; ++j) {
      at::Tensor t = test_tensor(shapes[k], at::kDouble, 40 + 4 * k + j) / 8;
      if (j == 3) t = t.abs();
      full[j].push_back(t);
      dist[j].push_back(distribute_tensor(t, m, placements[k]));
    }
  const double lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.1;
  auto step = [&](State& state) {
    auto& [params, grads, exp_avg, exp_avg_sq] = state;
    at::_foreach_mul_(params, 1 - lr * weight_decay);
    at::_foreach_lerp_(exp_avg, grads, 1 - beta1);
    at::_foreach_mul_(exp_avg_sq, beta2);
    at::_foreach_addcmul_(exp_avg_sq, grads, grads, 1 - beta2);
    std::vector<at::Tensor> denom = at::_foreach_sqrt(exp_avg_sq);
    at::_foreach_div_(denom, std::sqrt(1 - beta2));
    at::_foreach_add_(denom, eps);
    at::_foreach_addcdiv_(params, exp_avg, denom, -lr / (1 - beta1));
  };
  CommDebugMode debug;
  step(dist);
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  step(full);
  for (size_t k = 0; k < shapes.size(); ++k) {
    EXPECT_EQ(placements_of(dist[0][k]), placements[k]) << "parameter " << k;
    EXPECT_TRUE(tensors_close(full_tensor(dist[0][k]), full[0][k], 1e-12, 1e-14)) << "parameter " << k;
    EXPECT_TRUE(tensors_close(full_tensor(dist[3][k]), full[3][k], 1e-12, 1e-14)) << "exp_avg_sq " << k;
  }
}

}  // namespace
}  // namespace dtensor::testing
