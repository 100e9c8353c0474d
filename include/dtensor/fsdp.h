#pragma once
// Fully sharded data parallelism for torch::nn modules: PyTorch's FSDP2 (fully_shard), in C++.
//
// fully_shard(module, mesh) makes every parameter of `module` (except those of submodules already fully
// sharded) a DTensor Shard(0) (or along FullyShardOptions::shard_dim) on the data-parallel mesh, uneven
// sizes as torch.chunk cuts them: each rank keeps 1/N of the parameters, their gradients and the
// optimizer state. The module's parameters
// form one group. When the module is called through dtensor::call, the group's shards are gathered in
// one all-gather before its forward, and freed after it (reshard_after_forward); before its backward
// they are gathered again, and its gradients leave in one reduce-scatter (averaged over the mesh)
// straight into the sharded parameters' gradients. torch::optim steps the sharded parameters as they
// are (dtensor::step_on_local_shards steps only the local shards), and dtensor::checkpoint saves them
// as the whole tensors they are.
//
// Apply it bottom-up, as with FSDP2: each block first, then the root, which takes what is left (the
// embeddings, the head). The root keeps its parameters gathered from forward to backward, where they
// would be gathered again at once. Submodules that are not fully sharded themselves are called with
// the group's parameters gathered, through dtensor::call or not.
//
// What the hooks cannot see: a fully-sharded module must be called through dtensor::call (or a
// DistributedModule), and its parameters must be read inside its forward only, so that the gradient
// of its output is what reaches its backward first.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <functional>
#include <optional>
#include <string>

#include "dtensor/device_mesh.h"

namespace torch::nn {
class Module;
}

namespace dtensor {

// Mixed precision as FSDP2 defines it: fp32 sharded parameters (the master weights the optimizer
// steps), gathered and computed in param_dtype, gradients reduced in reduce_dtype and stored in the
// parameters' dtype. Unset fields leave that part in the parameters' dtype.
struct MixedPrecisionPolicy {
  std::optional<at::ScalarType> param_dtype;   // gathered parameters; floating inputs are cast to it
  std::optional<at::ScalarType> reduce_dtype;  // the reduce-scatter; unset: param_dtype
  std::optional<at::ScalarType> output_dtype;  // floating outputs of the module
};

struct FullyShardOptions {
  // On a mesh of more than one dim, the dim FSDP shards over. A dim that is neither this one nor
  // replicate_dim is tensor parallelism's: parameters that are DTensors on that dim's mesh
  // (parallelize_module(*model, mesh["tp"], plan) first) keep their TP placement, and FSDP shards each
  // rank's TP shard over dp along the first dim TP leaves whole.
  std::string dp_dim = "dp";
  // A mesh dim with this name makes the data parallelism hybrid (HSDP, FSDP2 on a 2-d mesh): parameters
  // are sharded over dp_dim and replicated over this dim, so a group gathers over dp_dim only (within a
  // host, when dp_dim spans one), and gradients are reduce-scattered over dp_dim and then averaged over
  // the replicas by an all-reduce of each shard. Meshes: {replicate, dp} or {replicate, dp, tp}.
  std::string replicate_dim = "replicate";
  // Free the gathered parameters after forward and gather again before backward (less memory, one
  // all-gather more per step). The root module ignores it: its backward comes straight after.
  bool reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy;
  // Which dim of a parameter FSDP shards over dp (FSDP2's shard_placement_fn): called with the
  // parameter's path in the module and the tensor (a TP parameter's local shard), it returns a dim
  // (negative counts from the end), or nullopt for the default: dim 0, or for a TP parameter the first
  // dim TP leaves whole. E.g. shard a weight's columns to keep each rank's rows whole.
  std::function<std::optional<int64_t>(const std::string& path, const at::Tensor& param)> shard_dim;
  // Communication overlapped with computation: before a group's forward, start gathering the group
  // that ran after it in the previous forward; before its backward, the group that ran before it; and
  // leave the gradients' reduce-scatter in flight, the gradients (DTensors) waiting for it at their
  // first use (the optimizer step or the norm clip). Off: every collective blocks where it is issued.
  bool overlap = true;
};

// Shards `module`'s parameters over `mesh` (1-d: the data-parallel ranks; 2-d: data parallel x tensor
// parallel, see dp_dim, or replicas x data parallel, see replicate_dim; 3-d: replicas x data parallel x
// tensor parallel) and installs the gathering hooks. Throws DTensorError for a module already
// fully sharded, a mesh that does not hold this rank, a parameter with no dims, a DTensor parameter
// on another mesh than the TP dim's (or Partial), a parameter held outside the module as well (tied to
// a module of another group, or held by an optimizer made before: make optimizers afterwards), a
// mixed-precision dtype that is not floating point, and a shard_dim out of range (or one TP shards).
void fully_shard(torch::nn::Module& module, const MeshPtr& mesh, const FullyShardOptions& options = {});

bool is_fully_sharded(const torch::nn::Module& module);

// Gathers the module's group now (its parameters become plain tensors with the whole values until
// reshard), e.g. to run forward under no_grad without gathering every call.
void unshard(torch::nn::Module& module);
// Frees the gathered parameters and puts the sharded ones back.
void reshard(torch::nn::Module& module);

// With false, backward accumulates each group's whole gradients on this rank instead of
// reduce-scattering them (gradient accumulation over micro-batches without communication); the next
// backward with true reduces the sum once. Applies to `module` and every fully-sharded module in it.
void set_requires_gradient_sync(torch::nn::Module& module, bool requires_sync);

}  // namespace dtensor
