#pragma once
// One fully_shard group: the sharded parameters of a module, gathered in one all-gather into one
// buffer of whole parameters, whose gradients leave in one reduce-scatter.
//
// Each rank's shards lie back to back in a flat send buffer, each padded to its torch.chunk size, so
// that the all-gather's [N, per-rank] result holds every parameter's rank blocks at one offset. The
// gathered parameters are views of one storage that reshard frees (its bytes, not the tensors): the
// tensors autograd saved in forward keep pointing at it, and see the values again once before_backward fills it
// before backward.
//
// With tensor parallelism on the other mesh dim, a parameter's "whole" value is its tensor-parallel
// shard (a DTensor on the TP mesh), and FSDP shards that over dp along the first dim TP leaves whole.
// One TP shards on every dim (a column-parallel bias) stays replicated over dp; its gradients are
// averaged over dp by one all-reduce for the group.
//
// With replicas (HSDP), every collective above runs over dp only, and the reduced gradients are then
// averaged over the replicas' dim: an all-reduce of this rank's shard, 1/dp of the group.
// set_requires_all_reduce(false) keeps that shard back (summed over the backwards in
// partial_grads_) until a backward with the all-reduce adds it to its own. A gradient divide factor
// divides the packed buffers before the reductions, which then sum instead of averaging.
//
// With CPU offload on a device mesh, the shards (the sharded DTensors' local tensors) are host tensors:
// they never alias the send buffer (on the device), every gather copies them in, and each reduced
// gradient is copied back to the host. Its collectives are attributed to "fully_shard(<path>)" in
// CommDebugMode.

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "../mesh/collectives.h"
#include "fsdp_buffers.h"
#include "dtensor/device_mesh.h"
#include "dtensor/fsdp.h"
#include "dtensor/spec.h"

namespace torch::nn {
class Module;
}

namespace dtensor::detail {

// Where a parameter is registered: (module, name) pairs, more than one for a weight tied inside the
// group; `path` names it in errors.
struct ParameterSlot {
  torch::nn::Module* module;
  std::string name;
  std::string path;
};

class FsdpGroup : public std::enable_shared_from_this<FsdpGroup> {
 public:
  struct Param {
    std::vector<ParameterSlot> slots;
    // The registered DTensor leaf on the group's mesh: Shard(dim) over dp (Replicate when dim is -1),
    // and its tensor-parallel placement on the other mesh dim.
    at::Tensor sharded;
    // A tensor-parallel parameter's spec on the TP mesh (in the compute dtype); null for a plain one.
    std::shared_ptr<const DTensorSpec> gathered_spec;
    std::vector<int64_t> shape;  // the gathered tensor's (a TP parameter's local shape)
    int64_t dim = 0;             // the dim sharded over dp; -1: replicated over dp

    // Set by the group.
    int64_t rows_per_rank = 0;  // torch.chunk's chunk size of `dim`
    int64_t row_numel = 0;      // elements per index of `dim`
    int64_t flat_offset = 0;    // in a rank's padded flat shard (or, replicated, in the replicated buffer)
    int64_t whole_offset = 0;   // in the gathered storage
    int64_t padded_numel() const { return rows_per_rank * row_numel; }
  };

  // `params` have their slots, sharded DTensors, gathered specs, shapes and dims set. `dp_dim` is the
  // mesh dim FSDP shards over; `replicate_dim` the one the parameters are replicated over (HSDP), or -1.
  FsdpGroup(std::string name, MeshPtr mesh, int64_t dp_dim, int64_t replicate_dim, FullyShardOptions options,
            std::vector<Param> params);
  ~FsdpGroup();
  FsdpGroup(const FsdpGroup&) = delete;
  FsdpGroup& operator=(const FsdpGroup&) = delete;

  const std::string& name() const { return name_; }
  const FullyShardOptions& options() const { return options_; }
  // The group of the outermost fully-sharded module around this one (itself until an ancestor is
  // fully sharded): it records the order in which the groups run forward, for prefetching.
  void set_root(const std::shared_ptr<FsdpGroup>& root) { root_ = root; }
  bool is_root() const { return root_.lock().get() == this; }
  std::shared_ptr<FsdpGroup> root() const { return root_.lock(); }
  // As FSDP2's, it sets the all-reduce over the replicas too.
  void set_requires_gradient_sync(bool sync) { requires_sync_ = all_reduce_ = sync; }
  void set_requires_all_reduce(bool all_reduce) { all_reduce_ = all_reduce; }
  // After this, the root too follows reshard_after_forward (by default it keeps its parameters).
  void set_reshard_after_forward(bool reshard) {
    options_.reshard_after_forward = reshard;
    reshard_after_forward_set_ = true;
  }
  // Unset: the gradients are averaged over the data-parallel ranks; set: summed, then divided by it.
  void set_gradient_divide_factor(std::optional<double> factor) { divide_factor_ = factor; }
  void set_unshard_in_backward(bool unshard) { unshard_in_backward_ = unshard; }
  void set_all_reduce_hook(std::function<void(const at::Tensor&)> hook) { all_reduce_hook_ = std::move(hook); }
  // After an exception aborted a forward or backward: in-flight collectives waited for, the
  // parameters resharded, and the iteration's state (accumulated gradients included) dropped.
  void reset_iter_state();
  void set_reshard_after_backward(bool reshard) { reshard_after_backward_ = reshard; }
  // The explicit prefetch lists (empty: the implicit order).
  void set_forward_prefetch(std::vector<std::weak_ptr<FsdpGroup>> groups) { forward_prefetch_ = std::move(groups); }
  void set_backward_prefetch(std::vector<std::weak_ptr<FsdpGroup>> groups) { backward_prefetch_ = std::move(groups); }
  // The module's path under its root ("blocks.1"; empty for the root itself), which names its collectives.
  void set_path(const std::string& path);
  const std::string& label() const { return label_; }
  // Whether the shards live in host memory apart from the device (CPU offload on a device mesh).
  bool offloaded() const { return offloaded_; }

  // unshard(async_op): starts the all-gather (or, when the values are gathered already, puts the whole
  // parameters in place at once); wait_for_unshard completes a gather still in flight.
  void start_unshard();
  void wait_for_unshard();
  // While held (call_as_forward runs), forwards of the module nested in it neither record, prefetch
  // nor reshard: the outermost call decides.
  void hold() { ++held_; }
  void release() { --held_; }
  bool held() const { return held_ > 0; }

  // The module's hooks. Before its forward: unshard, and (overlap) start gathering the group that ran
  // after this one in the previous forward.
  void before_forward();
  // After its forward: free the gathered parameters unless backward needs them at once (the root) or
  // nothing saved them for a backward. True when backward then needs before_backward (the parameters
  // were freed, or there is an explicit backward prefetch list).
  bool after_forward(bool backward_follows);
  // Before its backward (its output's gradient arrived; once per backward of the group): the gathered
  // values again, and start gathering the backward prefetch list, or (overlap) the group that ran
  // before this one.
  void before_backward();

  // Gathers the shards into the whole parameters and points the module's slots at them. Gathers again
  // when a shard changed since (an optimizer step), and under grad mode connects the whole parameters
  // to the shards through one autograd node (FsdpGatherBackward, whose backward is reduce_gradients)
  // unless they are connected already.
  void unshard();
  // Frees the whole parameters' bytes and points the slots back at the sharded parameters.
  void reshard();

  // The backward: whole gradients (in the gathered order, undefined for an unused parameter) reduced
  // onto the shards, as DTensor gradients of the sharded parameters (undefined while accumulating
  // without sync).
  std::vector<at::Tensor> reduce_gradients(const std::vector<at::Tensor>& whole_grads);

 private:
  at::ScalarType compute_dtype() const;
  at::ScalarType reduce_dtype() const;
  at::TensorOptions options_of(at::ScalarType dtype) const;
  // Makes the dim-0 shards stored in the compute dtype views of send_buffer_ at their flat offsets.
  void alias_shards_into_send_buffer();
  bool aliases_send_buffer(const Param& p) const;
  void start_gather();  // the shards' all-gather, started (`gathering_`)
  void gather_into_storage();
  bool shards_changed() const;
  // The group `step` places after this one in the root's last forward order (null: none).
  std::shared_ptr<FsdpGroup> neighbour(int step) const;
  // Starts gathering this group ahead of its use, unless it has nothing to gather (or, for its
  // backward, is not to be gathered there: set_unshard_in_backward(false)).
  void prefetch(bool for_backward);
  static void prefetch_all(const std::vector<std::weak_ptr<FsdpGroup>>& groups, bool for_backward);
  void allocate_storage();
  void free_storage();
  at::Tensor storage_view(const Param& p) const;  // a fresh tensor aliasing p's place in the storage
  void point_slots(const std::vector<at::Tensor>& values);
  // Sum with a divide factor (the buffers divided before), else Avg.
  ReduceOp reduce_op() const { return divide_factor_ ? ReduceOp::Sum : ReduceOp::Avg; }
  // The reduction over the replicas (HSDP) of a reduction over dp, once that completes, with what
  // earlier backwards reduced without it (`partial`) added; with the all-reduce off, the result is
  // added to `partial` instead. `reduced` itself without replicas.
  StartedCollective over_replicas(StartedCollective reduced, at::Tensor& partial) const;
  // The local gradient of `p`'s shard, from this rank's reduced flat buffers.
  at::Tensor shard_gradient(const Param& p, const at::Tensor& mine, const at::Tensor& replicated) const;
  // The whole gradients packed (or, accumulating, added) into the flat buffers the reductions take.
  void pack_gradients(const std::vector<at::Tensor>& whole_grads, const at::Tensor& flat, const at::Tensor& replicated,
                      bool fresh) const;
  // Starts the reductions of the packed buffers; the shards' gradients (of the parameters `has_grad`
  // marks), pending with overlap.
  std::vector<at::Tensor> start_reductions(std::vector<bool> has_grad, const at::Tensor& flat, const at::Tensor& replicated);

  FsdpBufferUse buffer_use_;  // first, so destroyed last: the group's own buffers are back in the cache by then
  std::string name_;
  MeshPtr mesh_;
  int64_t dp_dim_;
  int64_t replicate_dim_;
  int64_t dp_size_, dp_rank_;
  FullyShardOptions options_;
  std::vector<Param> params_;
  int64_t shard_numel_ = 0;       // a rank's padded flat shard
  int64_t replicated_numel_ = 0;  // the parameters replicated over dp, back to back
  int64_t whole_numel_ = 0;       // the gathered storage
  // A rank's flat shard as the all-gather sends it. The shards that can be are views of it, so that a
  // gather copies in only the others (cut along another dim, or cast to a compute dtype); the optimizer
  // step and a checkpoint load write the shards in place, so it always holds their values.
  at::Tensor send_buffer_;
  c10::Storage storage_;
  bool storage_filled_ = false;
  std::vector<int64_t> gathered_versions_;  // of each shard (the DTensor's and its local's) when gathered
  bool unsharded_ = false;
  bool connected_ = false;  // the slots hold whole parameters with an autograd node
  std::weak_ptr<FsdpGroup> root_;
  std::vector<std::weak_ptr<FsdpGroup>> forward_order_, recording_;  // the root's: last forward's, this one's
  std::unordered_set<const FsdpGroup*> recorded_;  // the root's: the groups in recording_
  std::optional<StartedCollective> gathering_;  // this group's all-gather in flight
  std::optional<std::vector<StartedCollective>> reducing_;  // the root's: the last group's reductions in flight
  bool requires_sync_ = true;
  bool reshard_after_backward_ = true;
  std::vector<std::weak_ptr<FsdpGroup>> forward_prefetch_, backward_prefetch_;
  std::string label_;       // "fully_shard(<path>)"
  bool offloaded_ = false;  // the shards are host tensors, the buffers on the mesh's device
  int held_ = 0;
  bool in_backward_ = false;  // before_backward ran since the last forward or reduction
  // Whole gradients accumulated without sync: [dp_size * shard_numel_] and [replicated_numel_].
  at::Tensor pending_grads_, pending_replicated_;
  bool all_reduce_ = true;  // over the replicas (HSDP)
  // Reduced over dp but not yet over the replicas (set_requires_all_reduce(false)): [shard_numel_] and
  // [replicated_numel_].
  at::Tensor partial_grads_, partial_replicated_;
  // The parameters with a gradient in the pending or partial buffers (a backward without sync may have
  // used parameters the reducing one does not: a root whose head and embeddings run in two pipeline
  // stages). Empty: none.
  std::vector<bool> grads_held_;
  bool reshard_after_forward_set_ = false;  // set_reshard_after_forward was called: the root obeys it too
  std::optional<double> divide_factor_;
  bool unshard_in_backward_ = true;
  std::function<void(const at::Tensor&)> all_reduce_hook_;
};

// Whether the shards of a group with these options on `mesh` live in host memory apart from the device:
// CPUOffloadPolicy on a mesh whose device is not the CPU.
bool offloads_to_host(const FullyShardOptions& options, const DeviceMesh& mesh);

// Whether `tensor` is a gathered parameter of a live fully_shard group (it lies in a group's storage).
// One set lookup: the optimizer step asks it of every parameter.
bool is_gathered_fsdp_parameter(const at::Tensor& tensor);

}  // namespace dtensor::detail
