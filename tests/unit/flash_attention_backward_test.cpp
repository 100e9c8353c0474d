// add_flash_attention_backward calls ATen's CPU flash-attention backward kernel directly and relies on it
// adding into the gradient buffers it is given (flash_attention_backward.cpp). Against the ATen op,
// which hands the kernel zeros: the buffers end as what they held plus the op's gradients, with
// grouped-query heads, causal or not, at lengths under and over the kernel's block sizes.

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <tuple>

#include "../../src/sharding/kernels/context_attention.h"
#include "../support/error_of.h"

namespace dtensor::detail {
namespace {

using ::testing::HasSubstr;

TEST(FlashAttentionBackwardTest, AddsTheOpsGradientsIntoTheBuffers) {
  at::manual_seed(0);
  for (const auto& [query_heads, kv_heads, positions] : {std::tuple{1, 1, 1000}, std::tuple{4, 2, 77}, std::tuple{2, 1, 900}}) {
    for (const bool causal : {true, false}) {
      const at::Tensor q = at::randn({2, query_heads, positions, 16}, at::kDouble), k = at::randn({2, kv_heads, positions, 16}, at::kDouble);
      const at::Tensor v = at::randn_like(k);
      const auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, {}, 0.3);
      const at::Tensor grad_out = at::randn_like(out);
      const auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, 0.0, causal, {}, 0.3);
      const FlashGradients held{at::randn_like(q), at::randn_like(k), at::randn_like(v)};
      const FlashGradients grads{empty_heads_last(q.sizes(), q.options()).copy_(held.q), empty_heads_last(k.sizes(), k.options()).copy_(held.k),
                                 empty_heads_last(v.sizes(), v.options()).copy_(held.v)};
      add_flash_attention_backward(grads, grad_out, q, k, v, out, lse, causal, 0.3);
      EXPECT_TRUE(at::allclose(grads.q, held.q + dq, 1e-12, 1e-12)) << query_heads << " heads, " << positions << " positions";
      EXPECT_TRUE(at::allclose(grads.k, held.k + dk, 1e-12, 1e-12)) << query_heads << " heads, " << positions << " positions";
      EXPECT_TRUE(at::allclose(grads.v, held.v + dv, 1e-12, 1e-12)) << query_heads << " heads, " << positions << " positions";
    }
  }
}

TEST(FlashAttentionBackwardTest, RefusesBuffersUnlikeTheirInputs) {
  const at::Tensor q = at::randn({1, 2, 8, 4}), k = at::randn({1, 1, 8, 4});
  const auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, k, 0.0, false);
  const at::Tensor grad_k = at::zeros_like(k);
  EXPECT_THAT(testing::error_of([&] { add_flash_attention_backward({at::zeros({1, 1, 8, 4}), grad_k, grad_k}, out, q, k, k, out, lse, false, {}); }),
              HasSubstr("the query gradient's buffer"));
  EXPECT_THAT(testing::error_of([&] { add_flash_attention_backward({at::zeros_like(q), grad_k.to(at::kDouble), grad_k}, out, q, k, k, out, lse, false, {}); }),
              HasSubstr("the key gradient's buffer"));
}

}  // namespace
}  // namespace dtensor::detail
