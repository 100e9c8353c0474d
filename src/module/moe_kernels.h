#pragma once
// The MoE layer's routing on one rank's plain tensors (the experts' computation, which graph programs
// share, is in the sharding layer: sharding/kernels/grouped_experts.h). The modules (moe.cpp) run it
// directly, or through local_map under expert parallelism.

#include <ATen/core/Tensor.h>

#include <string>

#include "dtensor/moe.h"

namespace dtensor::detail {

// The dtype router probabilities are computed in: float, or the logits' own when wider (transformers
// computes them in float).
at::ScalarType router_precision(const at::Tensor& logits);

// The router after its gate: `logits` [tokens, experts] -> Routing (capacity applied per `options`).
Routing route_from_logits(const at::Tensor& logits, const MoEOptions& options);

}  // namespace dtensor::detail
