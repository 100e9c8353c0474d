#pragma once
// Training helpers for parameters that are DTensors (torch::optim's optimizers step them as they are).

#include <ATen/core/Tensor.h>

#include <vector>

namespace dtensor {

// Scales the gradients of `parameters` in place so that their global norm (of order norm_type; 2 by
// default, infinity allowed) is at most max_norm, and returns that norm as it was before clipping.
// What torch::nn::utils::clip_grad_norm_ computes, over whole gradients: a sharded gradient counts each
// element once, a replicated one once, whatever the mix of plain tensors and DTensors on any meshes.
// Costs one scalar all-reduce per distinct (mesh, sharded mesh dims) among the gradients, instead of
// one per parameter. Partial gradients are reduced first.
double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0);

}  // namespace dtensor
