// The math attention (_scaled_dot_product_attention_math): what scaled_dot_product_attention runs
// when no fused kernel applies (dropout on CPU, a backend turned off, unsupported shapes). It is a
// composite of matmul, softmax and friends, which dtensor shards op by op, but with is_causal it
// builds its causal mask as a plain tensor and adds it to the DTensor scores. On DTensors it runs
// with plain tensors it makes treated as Replicate: the mask is [queries, keys], the same on every
// rank, and it broadcasts over the sharded batch and head dims. The caller's own masks must still be
// DTensors, as everywhere else.

#include <ATen/ATen.h>
#include <ATen/ops/_scaled_dot_product_attention_math_native.h>
#include <torch/library.h>

#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "dtensor/sharding.h"

namespace dtensor::rules {
namespace {

std::tuple<at::Tensor, at::Tensor> math_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                                  const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                                                  const std::optional<at::Tensor>& dropout_mask, std::optional<double> scale,
                                                  bool enable_gqa) {
  for (const auto* mask : {&attn_mask, &dropout_mask})
    if (mask->has_value() && (*mask)->defined() && (*mask)->dim() > 0 && !is_dtensor(**mask) && !ImplicitReplicationGuard::active())
      throw DTensorError("scaled_dot_product_attention got a plain tensor mask of shape " + c10::str((*mask)->sizes()) +
                         " mixed with DTensors; distribute it (distribute_tensor / from_local), or treat it as Replicate "
                         "inside a dtensor::ImplicitReplicationGuard");
  ImplicitReplicationGuard causal_mask_is_replicated;
  return at::native::_scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal, dropout_mask, scale,
                                                        enable_gqa);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse2, m) { m.impl("_scaled_dot_product_attention_math", TORCH_FN(math_attention)); }

}  // namespace dtensor::rules
