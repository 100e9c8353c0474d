#pragma once
// Tensor parallelism for torch::nn modules: PyTorch's parallel styles and parallelize_module.
//
//   parallelize_module(*model, mesh, {
//       {"blocks.*.attn.wq", ColwiseParallel{}},
//       {"blocks.*.attn.wo", RowwiseParallel{}},
//       {"lm_head", ColwiseParallel{.use_local_output = false}},  // class-sharded logits: loss parallel
//   });
//   at::Tensor y = dtensor::call(model, x);
//
// A style does two things. It gives the module's parameters their placements (this holds however the
// module is called). And it converts the module's inputs and output at its boundary (input_layout:
// how a plain tensor argument is read; the layout forward wants; output_layout; use_local_output).
// Those conversions are forward hooks, so they run when the module is called through dtensor::call
// (see module.h); a parent that calls `wq(x)` directly gets the parameter placements and sharding
// propagation, but not the boundary conversions.
//
// Layouts are placements on the tensor-parallel mesh dim. On a mesh with more dims (data parallel x
// tensor parallel), parameters are Replicate on the other dims, their gradients are reduced over them,
// and a plain tensor entering a module is this rank's part of a batch split along dim 0 there.
//
// Cross-entropy over class-sharded logits (ColwiseParallel lm_head with output_layout Shard(-1) and
// use_local_output = false) is loss parallel by itself: a fused cross-entropy computes it with two small
// all-reduces forward and none backward, and never gathers the logits. A plain target tensor may meet the DTensor logits under an
// ImplicitReplicationGuard (sharding.h), held over backward too (as PyTorch's loss_parallel context),
// or be converted on the way in (PrepareModuleInput).

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dtensor/module.h"
#include "dtensor/parallel_style.h"

namespace dtensor {

void parallelize_module(torch::nn::Module& module, const MeshPtr& mesh, const ParallelizePlan& plan,
                        const ParallelizeOptions& options = {});

// PyTorch's input_reshard, with the activation checkpointing it is used with (checkpoint_wrapper): the
// module keeps nothing from its forward but its Tensor inputs, each Replicate one (a plain tensor is one
// on tp_mesh) kept sharded along `input_reshard_dim` over tp_mesh, and in backward the inputs are
// gathered back (one all-gather each) and the forward is run again to differentiate it. Departure:
// PyTorch reshards every tensor autograd saves in the forward through saved-tensor hooks, which
// LibTorch has only for Python; in C++ the recomputation makes the inputs the only saved tensors. The
// recomputed forward replays the CPU generator's draws (dropout); its communication runs again.
// nullopt does nothing, as in PyTorch. Needs the module to be called through dtensor::call, to return
// one Tensor and to take copyable arguments.
void input_reshard(torch::nn::Module& module, const MeshPtr& tp_mesh, std::optional<int64_t> input_reshard_dim);

// The submodules `pattern` selects, with their paths (exposed for tools and tests).
std::vector<std::pair<std::string, torch::nn::Module*>> match_submodules(torch::nn::Module& root,
                                                                        const std::string& pattern);

}  // namespace dtensor
