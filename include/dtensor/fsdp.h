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
// DistributedModule), and its parameters must be read inside its forward only (or inside
// call_as_forward, below), so that the gradient of its output is what reaches its backward first.
//
// The controls of FSDP2's FSDPModule, as functions of the module: unshard (synchronous, or started
// with an UnshardHandle to wait on), reshard, set_requires_gradient_sync, set_reshard_after_backward,
// set_reshard_after_forward, set_gradient_divide_factor, set_requires_all_reduce,
// set_unshard_in_backward, reset_iter_state, set_all_reduce_hook,
// set_modules_to_forward_prefetch / set_modules_to_backward_prefetch; call_as_forward stands for
// register_fsdp_forward_method; FullyShardOptions::offload_policy for fully_shard's offload_policy.
// Where dtensor departs from PyTorch 2.15, the comment at each says so and why.
//
// In CommDebugMode a group's all-gathers and reductions are attributed to "fully_shard(<path>)", the
// module's path under its fully-sharded root ("blocks.1"; the root's own type name for the root).

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/module.h"

namespace torch::nn {
class Module;
}

namespace dtensor {

namespace detail {
class FsdpGroup;
}

// FSDP2's offload policies. OffloadPolicy, the default, offloads nothing.
struct OffloadPolicy {};
// CPUOffloadPolicy on a mesh whose device is not the CPU (CUDA): the sharded parameters (each rank's
// shards, the DTensors' local tensors), their gradients and so the optimizer state live in host
// memory (page-locked with pin_memory, which makes the copies faster but takes memory other processes
// cannot have). Before a group's all-gather its shards are copied to the device, and after its
// reduce-scatter the reduced gradients are copied back to the host; torch::optim (or
// step_on_local_shards) then steps on the host. The gathered parameters and the whole gradients stay
// on the device, freed as without offload. Departure: the copy back to the host is synchronous (PyTorch
// overlaps it on a stream and waits at the end of backward); the copy to the device is asynchronous
// from pinned memory. Not yet run on a GPU: tests/cuda (FullyShardCpuOffload...) checks it where one
// is present and dtensor is built with NCCL (-DDTENSOR_WITH_NCCL=ON, which CUDA meshes need).
// On a CPU mesh the parameters live in host memory already, so the policy changes nothing: it is
// accepted, training is exactly as without it, and offloads_to_cpu(module) answers false.
struct CPUOffloadPolicy {
  bool pin_memory = true;
};

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
  // set_modules_to_forward_prefetch / _backward_prefetch replace this order for a module.
  bool overlap = true;
  // FSDP2's offload_policy: CPUOffloadPolicy{.pin_memory = ...} keeps the sharded state in host memory
  // on device meshes (see CPUOffloadPolicy; the identity on CPU meshes).
  std::variant<OffloadPolicy, CPUOffloadPolicy> offload_policy = OffloadPolicy{};
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

// A started unshard (FSDP2's UnshardHandle): wait() completes the all-gather and puts the whole
// parameters in the module. Waiting is optional: the module's next forward (or call_as_forward) waits
// for it itself. wait() does nothing a second time, nor once that forward took the gather; a default
// handle (from a synchronous unshard) has nothing to wait for.
class UnshardHandle {
 public:
  UnshardHandle() = default;
  explicit UnshardHandle(std::shared_ptr<detail::FsdpGroup> group) : group_(std::move(group)) {}
  void wait();

 private:
  std::shared_ptr<detail::FsdpGroup> group_;
};

// FSDP2's unshard(async_op): with async_op false, unshard(module) and an empty handle; with true, the
// module's all-gather is started and the call returns at once (the parameters stay sharded until the
// handle's wait or the next forward), so that the gather overlaps what the caller does meanwhile.
// Not recursive, as in PyTorch: only the module's own group. Collectives must be started in the same
// order on every rank.
UnshardHandle unshard(torch::nn::Module& module, bool async_op);

// With false, backward accumulates each group's whole gradients on this rank instead of
// reduce-scattering them (gradient accumulation over micro-batches without communication); the next
// backward with true reduces the sum once. Applies to `module` and every fully-sharded module in it;
// with recurse false, to `module`'s own group alone (it must be fully sharded: else DTensorError).
void set_requires_gradient_sync(torch::nn::Module& module, bool requires_sync, bool recurse = true);

// FSDP2's set_reshard_after_backward: with false, a group's gathered parameters are not freed after its
// backward: they stay in the module (plain whole tensors, as after unshard) and the next forward uses
// them without gathering again (a group that reshards after forward still gathers before its
// backward). That trades memory for communication, e.g. over the micro-batches of gradient
// accumulation. recurse: also every fully-sharded module inside `module`. Throws DTensorError when
// `module` is not fully sharded. Departure: PyTorch asks for reshard() on every module before the
// optimizer changes the shards; dtensor notices changed shards (their version counters) at the next
// forward and gathers again, so stepping while gathered is safe; until then the module shows the
// values gathered before the step (reshard() shows the shards, and frees the memory).
void set_reshard_after_backward(torch::nn::Module& module, bool reshard_after_backward, bool recurse = true);

// FSDP2's set_reshard_after_forward: changes FullyShardOptions::reshard_after_forward after fully_shard,
// e.g. false for evaluation (forwards without backward still free the parameters: nothing saved them)
// and back to true for training. recurse: also every fully-sharded module inside `module`. As in
// PyTorch, the root obeys it once set: set_reshard_after_forward(root, true) frees the root's
// parameters after forward too (gathered again before its backward), where by default the root keeps
// them. Throws DTensorError when `module` is not fully sharded.
void set_reshard_after_forward(torch::nn::Module& module, bool reshard_after_forward, bool recurse = true);

// FSDP2's set_gradient_divide_factor: the module's gradients are summed over the data-parallel ranks
// (with HSDP, over the replicas as well: the whole data-parallel world) and divided by `factor`,
// instead of averaged. E.g. the world size times the micro-batches of gradient accumulation, or 1 for
// a sum. As in PyTorch, only `module`'s own group (not recursive) and the division comes first (NCCL's
// PreMulSum: each rank's contribution divided, then summed). Throws DTensorError when `module` is not
// fully sharded, or the factor is not a positive finite number.
void set_gradient_divide_factor(torch::nn::Module& module, double factor);

// FSDP2's set_requires_all_reduce, for HSDP: with false, backward still reduce-scatters each group's
// gradients over the dp dim but skips the all-reduce over the replicas: the reduced shards accumulate
// on this rank (gradient accumulation across micro-batches with the cross-host collective once), and
// the sharded parameters' gradients stay as they were. The next backward with true adds them to its
// own and all-reduces the sum once, into the gradients. Without replicas (a 1-d dp mesh) it changes
// nothing, as in PyTorch. set_requires_gradient_sync sets it too (as FSDP2's does). recurse: also every
// fully-sharded module inside `module`. Throws DTensorError when `module` is not fully sharded.
void set_requires_all_reduce(torch::nn::Module& module, bool requires_all_reduce, bool recurse = true);

// FSDP2's set_unshard_in_backward: with false, the module's group is not gathered again before its
// backward (nor prefetched for it), for a group whose backward reads none of its parameters (an
// embedding's: its gradient needs the indices only). Gradients are reduced as usual. A backward that
// does read them would find their storage freed: only for modules known not to. Not recursive (as in
// PyTorch). Throws DTensorError when `module` is not fully sharded.
void set_unshard_in_backward(torch::nn::Module& module, bool unshard_in_backward);

// FSDP2's reset_iter_state: after an exception aborted a forward or a backward, call it on the root
// before the next iteration. Every fully-sharded module in `module`: collectives in flight completed,
// the parameters resharded, and the iteration's state dropped, the gradients being accumulated without
// sync (set_requires_gradient_sync(false)) or without the all-reduce (set_requires_all_reduce(false))
// among it: restart the micro-batches. Throws DTensorError when `module` is not fully sharded.
void reset_iter_state(torch::nn::Module& module);

// FSDP2's set_all_reduce_hook: `hook` is called, in backward, with the module's reduced gradient
// shards (this rank's flat buffer of the group, in the reduce dtype) once they are final: after HSDP's
// all-reduce, or after the reduce-scatter without replicas; it may change them in place (e.g. its own
// all-reduce over another group), before the parameters' gradients are cut from them. Not called
// while set_requires_all_reduce(false) holds the shards back. An empty function removes it. Only the
// module's own group. Departures: PyTorch's optional CUDA stream has no counterpart (the hook runs on
// the thread of the backward), and with a hook set the group's reduction completes before its
// backward returns instead of overlapping the next group's; dtensor's parameters replicated over dp
// (TP shards that TP cut on every dim) have a second flat buffer, passed to the hook as well. Throws
// DTensorError when `module` is not fully sharded.
void set_all_reduce_hook(torch::nn::Module& module, std::function<void(const at::Tensor&)> hook);

// FSDP2's explicit prefetching. Before `module`'s forward computes (after its own gather), the
// all-gathers of `modules` are started, in the list's order; before its backward (once its own
// parameters are gathered again), those of the backward list. A list replaces the implicit prefetch
// (FullyShardOptions::overlap: the next group in the last forward's order, the previous one in
// backward) for this module, and works from the first step, whatever `overlap` says; an empty list
// gives the implicit prefetch back (for forward a departure: PyTorch's implicit forward overlap is
// CUDA streams', which an empty list leaves too). A module already gathered or being gathered is
// skipped. With two or more modules listed the gathers run further ahead, holding more memory. Every
// rank must set the same lists (the collectives must run in one order). Throws DTensorError when
// `module` or a listed module is not fully sharded, or a listed module is not under the same
// fully-sharded root (fully_shard the root first, then set the lists). The root's backward comes first
// (its parameters are the last the forward used), so its backward list can start the last block's
// gather, e.g. {blocks[n-1], blocks[n-2]}.
void set_modules_to_forward_prefetch(torch::nn::Module& module,
                                     const std::vector<std::shared_ptr<torch::nn::Module>>& modules);
void set_modules_to_backward_prefetch(torch::nn::Module& module,
                                      const std::vector<std::shared_ptr<torch::nn::Module>>& modules);

// Whether fully_shard keeps this module's sharded parameters, gradients and optimizer state in host
// memory apart from the compute device: true with CPUOffloadPolicy on a device (CUDA) mesh; false
// without the policy, and on a CPU mesh, where the policy is the identity. Throws DTensorError when
// `module` is not fully sharded.
bool offloads_to_cpu(const torch::nn::Module& module);

// The counterpart of FSDP2's register_fsdp_forward_method(module, "generate"): C++ has no method to
// patch by name, so the call site says which call is a forward. call_as_forward(module, fn, args...)
// runs fn(args...) as module's forward: the group gathered before (waiting for a started unshard,
// starting the prefetches), the Tensor args cast to the mixed-precision param_dtype, and after fn its
// result treated as the forward's output (cast to output_dtype; parameters freed per
// reshard_after_forward, gathered again before backward reaches them, and gradients reduced as
// usual). fn may read the module's parameters directly and call the module's own forward through
// dtensor::call any number of times: nested forwards of the module inside fn keep the parameters
// gathered (one all-gather for the whole call, e.g. a token-by-token generate), while fully-sharded
// submodules gather and free around each of their forwards as usual. fn returns void, a Tensor or a
// std::vector<at::Tensor> (the tensors a backward can start from; wrap other results in a lambda). For
// a module that is not fully sharded it just calls fn, as PyTorch's is a no-op there, so that one
// source serves the single-device run. If fn throws, the parameters are freed again.
template <typename Fn, typename... Args>
auto call_as_forward(torch::nn::Module& module, Fn&& fn, Args&&... args);

// ---- implementation ----

namespace detail {

// call_as_forward's pre- and post-forward around fn: the group's forward hooks.
class FsdpForwardScope {
 public:
  FsdpForwardScope(torch::nn::Module& module, std::vector<at::Tensor>& inputs);
  ~FsdpForwardScope();
  FsdpForwardScope(const FsdpForwardScope&) = delete;
  FsdpForwardScope& operator=(const FsdpForwardScope&) = delete;
  void finish(std::vector<at::Tensor>& outputs);

 private:
  std::shared_ptr<FsdpGroup> group_;
  bool finished_ = false;
};

template <typename... Args, typename Fn, typename Tuple, std::size_t... P>
decltype(auto) call_hooked(Fn& fn, std::vector<at::Tensor>& inputs, Tuple args, std::index_sequence<P...>) {
  return fn(hooked_argument<P, Args...>(inputs, std::get<P>(std::move(args)))...);
}

}  // namespace detail

template <typename Fn, typename... Args>
auto call_as_forward(torch::nn::Module& module, Fn&& fn, Args&&... args) {
  std::vector<at::Tensor> inputs;
  (
      [&](const auto& arg) {
        if constexpr (detail::is_tensor_v<decltype(arg)>) inputs.push_back(arg);
      }(args),
      ...);
  detail::FsdpForwardScope scope(module, inputs);
  auto invoke = [&]() -> decltype(auto) {
    return detail::call_hooked<Args...>(fn, inputs, std::forward_as_tuple(std::forward<Args>(args)...),
                                        std::index_sequence_for<Args...>{});
  };
  using Result = std::decay_t<decltype(invoke())>;
  static_assert(std::is_void_v<Result> || std::is_same_v<Result, at::Tensor> || std::is_same_v<Result, std::vector<at::Tensor>>,
                "call_as_forward: fn must return void, at::Tensor or std::vector<at::Tensor> (the tensors a backward "
                "can start from); wrap it in a lambda that returns those");
  std::vector<at::Tensor> outputs;
  if constexpr (std::is_void_v<Result>) {
    invoke();
    scope.finish(outputs);
  } else if constexpr (std::is_same_v<Result, at::Tensor>) {
    outputs.push_back(invoke());
    scope.finish(outputs);
    return std::move(outputs.front());
  } else {
    outputs = invoke();
    scope.finish(outputs);
    return outputs;
  }
}

}  // namespace dtensor
