#pragma once
// Training helpers for parameters that are DTensors (torch::optim's optimizers step them as they are;
// step_on_local_shards steps them faster).

#include <ATen/core/Tensor.h>

#include <vector>

#include "dtensor/device_mesh.h"

namespace torch::optim {
class Optimizer;
}

namespace dtensor {

// optimizer.step() with every DTensor parameter's update computed on its local shard: LibTorch's own
// step (its math, its state objects) runs over plain tensors that alias the shards of the parameters,
// their gradients and their optimizer state, instead of dispatching every op of the update as a DTensor
// op (AdamW: about nine per parameter, each paying sharding propagation and a DTensor wrapper). The
// result is the DTensor step's: an elementwise update on each rank's shard, every rank computing the
// same update of a Replicate parameter. A gradient or state tensor placed unlike its parameter (a
// Partial one) is first redistributed to the parameter's placements, as the DTensor step would (the
// state stays so). State the step creates becomes DTensors laid out as their parameters, so
// checkpoints (TrainingState) see the same optimizer either way. A parameter listed twice keeps one
// state, as with optimizer.step(). Adam, AdamW and SGD, whose updates are elementwise, are supported;
// any other optimizer is refused (its step may mix elements of a parameter), and so is a Partial
// parameter (Adam's squared gradients need its value). Plain tensor parameters are stepped as they are.
struct LocalStepOptions {
  // Adam and AdamW: each param group's update in one ATen fused kernel (at::_fused_adamw_, what
  // PyTorch's `fused=True` runs) over every shard, instead of LibTorch's ten or so ops per parameter.
  // The same update and the same state objects, rounded in another order: it may differ from
  // LibTorch's step in the last bits. Taken only where the kernel takes every tensor (contiguous,
  // gradients in their parameters' dtype); otherwise, and for SGD, LibTorch's step runs.
  bool fused = false;
};
void step_on_local_shards(torch::optim::Optimizer& optimizer, const LocalStepOptions& options = {});

// Scales the gradients of `parameters` in place so that their global norm (of order norm_type; 2 by
// default, infinity allowed) is at most max_norm, and returns that norm as it was before clipping.
// What torch::nn::utils::clip_grad_norm_ computes, over whole gradients: a sharded gradient counts each
// element once, a replicated one once, whatever the mix of plain tensors and DTensors on any meshes.
// Costs one scalar all-reduce per distinct (mesh, sharded mesh dims) among the gradients, instead of
// one per parameter. Partial gradients are reduced first.
double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0);

// The same for a model split into disjoint parts along dim `split_dim` of `split_mesh` (pipeline
// stages: each rank of the pp dim passes the parameters of its own stages), as torchtitan clips with
// its pp_mesh: the parts' norms combine across that dim (one more scalar all-reduce) before any
// gradient is scaled, so that every part is clipped by the whole model's norm, which is returned.
double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type, const MeshPtr& split_mesh,
                       int64_t split_dim);

}  // namespace dtensor
