#pragma once
// The MoE layer's computations on one rank's plain tensors: routing, and the experts with their
// dispatch over the ep dim. The modules (moe.cpp) run them directly, or through local_map under expert
// parallelism.

#include <ATen/core/Tensor.h>

#include <string>

#include "dtensor/moe.h"

namespace dtensor::detail {

// The dtype router probabilities are computed in: float, or the logits' own when wider (transformers
// computes them in float).
at::ScalarType router_precision(const at::Tensor& logits);

// The router after its gate: `logits` [tokens, experts] -> Routing (capacity applied per `options`).
Routing route_from_logits(const at::Tensor& logits, const MoEOptions& options);

// The weighted sum of each token's experts: `hidden` [tokens, hidden], `experts`/`weights` [tokens, k]
// (dropped_expert marks assignments to skip); `gate_up`/`down` hold this rank's experts (all of them
// unless `placement.mesh` spreads them over its dim, where they are the block of this coordinate).
// `path` names the layer in errors.
at::Tensor run_experts(const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights,
                       const at::Tensor& gate_up, const at::Tensor& down, const MoEOptions& options,
                       const ExpertPlacement& placement, const std::string& path);

}  // namespace dtensor::detail
