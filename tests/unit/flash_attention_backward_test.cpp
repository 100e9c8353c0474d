// add_flash_attention_backward calls ATen's CPU flash-attention backward kernel directly and relies on it
// adding into the gradient buffers it is given (src/sharding/kernels/context_attention.cpp). Against the ATen op,
// which hands the kernel zeros: the buffers end as what they held plus the op's gradients, with
// grouped-query heads, causal or not, at lengths under and over the kernel's block sizes, in double and
// bfloat16, into buffers that are heads-last views of larger ones (as all-to-all attention's halves).

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <tuple>

#include "../../src/sharding/kernels/context_attention.h"
#include "../support/error_of.h"

namespace dtensor::detail {
namespace {

using ::testing::HasSubstr;

// A heads-last buffer of `like`'s shape holding `values`: heads [heads, 2 heads) of one twice as wide.
at::Tensor view_in_wider_buffer(const at::Tensor& like, const at::Tensor& values) {
  at::IntArrayRef sizes = like.sizes();
  const at::Tensor wider = empty_heads_last({sizes[0], 2 * sizes[1], sizes[2], sizes[3]}, like.options()).zero_();
  return wider.narrow(1, sizes[1], sizes[1]).copy_(values);
}

TEST(FlashAttentionBackwardTest, AddsTheOpsGradientsIntoTheBuffers) {
  at::manual_seed(0);
  for (const at::ScalarType dtype : {at::kDouble, at::kBFloat16}) {
    // bfloat16: the kernel adds into the buffers in steps, rounding each (a few units in the last place,
    // 2^-5 at 4); a kernel that overwrote them would be off by the randn values held.
    const double rtol = dtype == at::kDouble ? 1e-12 : 2e-2, atol = dtype == at::kDouble ? 1e-12 : 0.1;
    for (const auto& [query_heads, kv_heads, positions] : {std::tuple{1, 1, 1000}, std::tuple{4, 2, 77}, std::tuple{2, 1, 900}}) {
      for (const bool causal : {true, false}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + ", " + std::to_string(query_heads) + " heads, " + std::to_string(positions) +
                     " positions, " + (causal ? "causal" : "full"));
        const at::TensorOptions options = at::TensorOptions().dtype(dtype);
        const at::Tensor q = at::randn({2, query_heads, positions, 16}, options), k = at::randn({2, kv_heads, positions, 16}, options);
        const at::Tensor v = at::randn_like(k);
        const auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, {}, 0.3);
        const at::Tensor grad_out = at::randn_like(out);
        const auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, 0.0, causal, {}, 0.3);
        const FlashGradients held{at::randn_like(q), at::randn_like(k), at::randn_like(v)};
        const FlashGradients grads{view_in_wider_buffer(q, held.q), view_in_wider_buffer(k, held.k), view_in_wider_buffer(v, held.v)};
        add_flash_attention_backward(grads, grad_out, q, k, v, out, lse, causal, 0.3);
        EXPECT_TRUE(at::allclose(grads.q.to(at::kDouble), held.q.to(at::kDouble) + dq.to(at::kDouble), rtol, atol));
        EXPECT_TRUE(at::allclose(grads.k.to(at::kDouble), held.k.to(at::kDouble) + dk.to(at::kDouble), rtol, atol));
        EXPECT_TRUE(at::allclose(grads.v.to(at::kDouble), held.v.to(at::kDouble) + dv.to(at::kDouble), rtol, atol));
      }
    }
  }
}

TEST(FlashAttentionBackwardTest, RefusesWhatTheKernelCannotRead) {
  const at::Tensor q = at::randn({1, 2, 8, 4}), k = at::randn({1, 1, 8, 4});
  const auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, k, 0.0, false);
  const at::Tensor grad_q = at::zeros_like(q), grad_k = at::zeros_like(k);
  const auto error = [&](const FlashGradients& grads, const at::Tensor& query, const at::Tensor& logsumexp) {
    return testing::error_of([&] { add_flash_attention_backward(grads, out, query, k, k, out, logsumexp, false, {}); });
  };
  EXPECT_THAT(error({at::zeros({1, 1, 8, 4}), grad_k, grad_k}, q, lse), HasSubstr("the query gradient's buffer must be sized and typed"));
  EXPECT_THAT(error({grad_q, grad_k.to(at::kDouble), grad_k}, q, lse), HasSubstr("the key gradient's buffer must be sized and typed"));
  EXPECT_THAT(error({grad_q, grad_k, at::zeros({1, 1, 4, 8}).transpose(2, 3)}, q, lse), HasSubstr("the value gradient's buffer must be a CPU tensor with a dense last dim"));
  EXPECT_THAT(error({grad_q, grad_k, grad_k}, at::randn({1, 2, 4, 8}).transpose(2, 3), lse), HasSubstr("the query must be a CPU tensor with a dense last dim"));
  EXPECT_THAT(error({grad_q, grad_k, grad_k}, q, lse.to(at::kDouble)), HasSubstr("the logsumexp must be Float"));
}

}  // namespace
}  // namespace dtensor::detail
