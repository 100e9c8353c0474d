// Top-k routing and GShard's capacity, on one token group.

#include <ATen/ATen.h>

#include <cmath>

#include "dtensor/errors.h"
#include "moe_kernels.h"

namespace dtensor::detail {

at::ScalarType router_precision(const at::Tensor& logits) { return at::promote_types(logits.scalar_type(), at::kFloat); }

namespace {

// The top-k experts and their weights in the logits' dtype, scored as `options` says (softmax in
// float, as transformers computes it).
std::pair<at::Tensor, at::Tensor> top_experts(const at::Tensor& logits, const MoEOptions& options) {
  if (options.scores == RouterScores::SoftmaxThenTopK) {
    const at::Tensor probabilities = at::softmax(logits, -1, router_precision(logits));
    auto [values, indices] = at::topk(probabilities, options.top_k, -1);
    if (options.normalize_top_k) values = values / values.sum(-1, true);
    return {values.to(logits.scalar_type()), indices};
  }
  auto [values, indices] = at::topk(logits, options.top_k, -1);
  return {at::softmax(values, -1, router_precision(logits)).to(logits.scalar_type()), indices};
}

// Whether each assignment [tokens, k] fits its expert's capacity: assignments are taken first choices
// first, each choice in token order, and an expert keeps its first `capacity`.
at::Tensor within_capacity(const at::Tensor& experts, int64_t expert_count, int64_t capacity) {
  const at::Tensor by_choice = experts.t().reshape(-1);  // choice-major
  const at::Tensor one_hot = at::one_hot(by_choice, expert_count);
  const at::Tensor place = (one_hot.cumsum(0) * one_hot).sum(1) - 1;  // the assignment's place at its expert
  return (place < capacity).reshape({experts.size(1), experts.size(0)}).t();
}

}  // namespace

Routing route_from_logits(const at::Tensor& logits, const MoEOptions& options) {
  auto [weights, experts] = top_experts(logits, options);
  Routing routing{logits, experts, weights, 0};
  if (!options.capacity_factor) return routing;
  const int64_t tokens = logits.size(0);
  const auto capacity = static_cast<int64_t>(
      std::ceil(*options.capacity_factor * static_cast<double>(tokens * options.top_k) / static_cast<double>(options.experts)));
  const at::Tensor kept = within_capacity(experts, options.experts, capacity);
  routing.dropped = kept.numel() - kept.sum().item<int64_t>();
  routing.experts = experts.masked_fill(kept.logical_not(), dropped_expert(options));
  routing.weights = routing.weights * kept;
  return routing;
}

}  // namespace dtensor::detail
