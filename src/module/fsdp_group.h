#pragma once
// One fully_shard group: the sharded parameters of a module, gathered in one all-gather into one
// buffer of whole parameters, whose gradients leave in one reduce-scatter.
//
// Each rank's shards lie back to back in a flat send buffer, each padded to its torch.chunk size, so
// that the all-gather's [N, per-rank] result holds every parameter's rank blocks at one offset. The
// gathered parameters are views of one storage that reshard frees (its bytes, not the tensors): the
// tensors autograd saved in forward keep pointing at it, and see the values again once refill fills it
// before backward.
//
// With tensor parallelism on the other mesh dim, a parameter's "whole" value is its tensor-parallel
// shard (a DTensor on the TP mesh), and FSDP shards that over dp along the first dim TP leaves whole.
// One TP shards on every dim (a column-parallel bias) stays replicated over dp; its gradients are
// averaged over dp by one all-reduce for the group.

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <memory>
#include <string>
#include <vector>

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
  // mesh dim FSDP shards over.
  FsdpGroup(std::string name, MeshPtr mesh, int64_t dp_dim, FullyShardOptions options, std::vector<Param> params);

  const std::string& name() const { return name_; }
  const FullyShardOptions& options() const { return options_; }
  bool is_root() const { return is_root_; }
  void set_root(bool root) { is_root_ = root; }
  void set_requires_gradient_sync(bool sync) { requires_sync_ = sync; }

  // Gathers the shards into the whole parameters and points the module's slots at them. Gathers again
  // when a shard changed since (an optimizer step), and under grad mode connects the whole parameters
  // to the shards through one autograd node (FsdpGatherBackward, whose backward is reduce_gradients)
  // unless they are connected already.
  void unshard();
  // Frees the whole parameters' bytes and points the slots back at the sharded parameters.
  void reshard();
  // Before the module's backward: the whole values again in the storage autograd saved (after a
  // reshard freed it); the slots stay sharded.
  void refill();
  // Whether `tensor` is one of this group's whole parameters (it lies in the group's storage).
  bool holds(const at::Tensor& tensor) const;

  // The backward: whole gradients (in the gathered order, undefined for an unused parameter) reduced
  // onto the shards, as DTensor gradients of the sharded parameters (undefined while accumulating
  // without sync).
  std::vector<at::Tensor> reduce_gradients(const std::vector<at::Tensor>& whole_grads);

 private:
  at::ScalarType compute_dtype() const;
  at::ScalarType reduce_dtype() const;
  at::TensorOptions options_of(at::ScalarType dtype) const;
  void gather_into_storage();
  bool shards_changed() const;
  void allocate_storage();
  void free_storage();
  at::Tensor storage_view(const Param& p) const;  // a fresh tensor aliasing p's place in the storage
  void point_slots(const std::vector<at::Tensor>& values);
  // The sharded parameters' gradients from the reduced flat buffers.
  std::vector<at::Tensor> shard_gradients(const at::Tensor& mine, const at::Tensor& replicated,
                                          const std::vector<at::Tensor>& whole_grads) const;

  std::string name_;
  MeshPtr mesh_;
  int64_t dp_dim_;
  int64_t dp_size_, dp_rank_;
  FullyShardOptions options_;
  std::vector<Param> params_;
  int64_t shard_numel_ = 0;       // a rank's padded flat shard
  int64_t replicated_numel_ = 0;  // the parameters replicated over dp, back to back
  int64_t whole_numel_ = 0;       // the gathered storage
  c10::Storage storage_;
  bool storage_filled_ = false;
  std::vector<int64_t> gathered_versions_;  // of each shard (the DTensor's and its local's) when gathered
  bool unsharded_ = false;
  bool connected_ = false;  // the slots hold whole parameters with an autograd node
  bool is_root_ = false;
  bool requires_sync_ = true;
  // Whole gradients accumulated without sync: [dp_size * shard_numel_] and [replicated_numel_].
  at::Tensor pending_grads_, pending_replicated_;
};

// Whether `tensor` is a gathered parameter of some fully_shard group (fully_shard.cpp keeps the groups).
bool is_gathered_fsdp_parameter(const at::Tensor& tensor);

}  // namespace dtensor::detail
