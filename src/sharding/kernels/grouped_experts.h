#pragma once
// A mixture of experts' experts on one rank's plain tensors, with their expert-parallel dispatch: the
// MoE layer (src/module) and graph programs' dtensor::moe_experts op (rules/experts.cpp) run it.

#include <ATen/core/Tensor.h>

#include <string>

#include "dtensor/device_mesh.h"

namespace dtensor::detail {

// Where the experts are: all here (no mesh), or spread over dim `dim` of `mesh` as Shard(0), this
// rank holding its coordinate's block.
struct ExpertsSpread {
  MeshPtr mesh;
  int64_t dim = 0;
};

// The weighted sum of each token's experts' SwiGLU MLPs, transformers' experts forward:
// `hidden` [tokens, hidden], `experts`/`weights` [tokens, k] (expert `num_experts` marks an assignment
// to skip, a dropped one); `gate_up` [experts, 2 * intermediate, hidden] (gate rows first) and `down`
// [experts, hidden, intermediate] hold this rank's experts (all `num_experts` unless `spread` has a
// mesh). Under a spread every member of its dim calls it, with its own tokens (any number, zero
// included): tokens travel to their experts' ranks and back by all-to-all. Differentiable. `path`
// names the layer in errors (a router index out of range stops every member, naming the rank).
at::Tensor run_experts(const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights, const at::Tensor& gate_up,
                       const at::Tensor& down, int64_t num_experts, const ExpertsSpread& spread, const std::string& path);

// Refuses expert indices outside [0, num_experts] (num_experts marking a dropped assignment), naming
// the layer `path` and the index.
void check_routing(const at::Tensor& experts, int64_t num_experts, const std::string& path);

}  // namespace dtensor::detail
