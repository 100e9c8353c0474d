#pragma once
// The DTensor API: create DTensors from whole tensors or local shards, move them between placements,
// and get local or whole tensors back. Every function here is differentiable where PyTorch's is.

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>

#include "dtensor/dtensor_impl.h"
#include "dtensor/redistribute_plan.h"

namespace dtensor {

// Splits a leaf tensor over `mesh`: the data held by the mesh's first rank along each dim is the
// truth and is scattered (Shard) or broadcast (Replicate, Partial) from there. Default placements:
// all Replicate. requires_grad carries over and the result is a leaf. A DTensor already on this mesh
// with these placements is returned as is.
at::Tensor distribute_tensor(const at::Tensor& tensor, const MeshPtr& mesh,
                             std::optional<Placements> placements = std::nullopt);

struct FromLocalOptions {
  // Check across ranks that local shapes form a valid layout (torch.chunk sizes along sharded dims,
  // equal shapes along Replicate/Partial dims), derive the exact global shape from them (uneven shards
  // included), and broadcast replicas from the first rank of each Replicate dim.
  bool run_check = true;
  // The global shape and stride; give both or neither. Without them and without run_check, shards are
  // assumed to be even (every shard the full chunk size).
  std::optional<Shape> shape;
  std::optional<Shape> stride;
};

// Wraps this rank's shard as a DTensor. Differentiable: the gradient of `local` is the DTensor's
// gradient brought back to `placements`.
at::Tensor from_local(const at::Tensor& local, const MeshPtr& mesh, const Placements& placements,
                      const FromLocalOptions& options = {});

// This rank's shard (sharing memory). Differentiable: `grad_placements` says what layout the
// gradient of the local tensor has (default: the DTensor's own placements).
at::Tensor to_local(const at::Tensor& dtensor, std::optional<Placements> grad_placements = std::nullopt);

// The same tensor with other placements on its mesh (`mesh` null or the same mesh), or on another mesh
// of the same world whose ranks overlap this one's or not (pipeline stages, a training mesh to a serving
// mesh): there only the overlapping index ranges move, from the ranks holding them to the ranks needing
// them (one all-to-all over the union of both meshes' ranks; Partial mesh dims are reduced on the source
// mesh first). Every rank of both meshes must call it (ranks outside the target get an empty shard),
// and, when differentiated, run the backward through it. Partial targets are refused unless the mesh
// dim is already that Partial on the same mesh. Differentiable.
at::Tensor redistribute(const at::Tensor& dtensor, const MeshPtr& mesh, const Placements& placements);
inline at::Tensor redistribute(const at::Tensor& dtensor, const Placements& placements) {
  return redistribute(dtensor, nullptr, placements);
}

// Moving a DTensor in (std::move(dt), or a temporary) donates its memory: the handle is consumed (left
// undefined once the placements are validated), and where nothing else can see the local shard, the
// result may reuse its buffer instead of a copy (a Partial -> Replicate all-reduce then runs in place).
// Nothing else means no other handle to the DTensor, to its local tensor or to that tensor's storage
// (views, from_local's caller, DTensor copies and autograd nodes that saved it all hold one; the
// redistribution's own backward needs no values); otherwise the shard is copied as by the overload
// above, so values and gradients are the same either way. Memory the storage does not own
// (at::from_blob) counts as owned: do not donate a DTensor over a buffer that is still in use.
at::Tensor redistribute(at::Tensor&& dtensor, const MeshPtr& mesh, const Placements& placements);
inline at::Tensor redistribute(at::Tensor&& dtensor, const Placements& placements) {
  return redistribute(std::move(dtensor), nullptr, placements);
}

struct RedistributeOptions {
  // Start the communication and return at once (PyTorch's async_op): the result's first use (an op on
  // it, to_local, local_tensor_of) waits for it, so work issued in between overlaps the transfer. A
  // plan that is one all-gather, reduce-scatter or all-reduce (with local steps around it) runs so;
  // others, and moves to another mesh, complete before returning. Errors surface at the first use.
  bool async_op = false;
};
at::Tensor redistribute(const at::Tensor& dtensor, const MeshPtr& mesh, const Placements& placements,
                        const RedistributeOptions& options);
inline at::Tensor redistribute(const at::Tensor& dtensor, const Placements& placements,
                               const RedistributeOptions& options) {
  return redistribute(dtensor, nullptr, placements, options);
}

// The whole tensor on every rank (all-Replicate, then to_local). Differentiable.
at::Tensor full_tensor(const at::Tensor& dtensor, std::optional<Placements> grad_placements = std::nullopt);

// The plan redistribute(dtensor, placements) would run on this rank (pure; nothing is sent).
RedistributePlan redistribute_plan(const at::Tensor& dtensor, const Placements& placements);

// Queries; each throws DTensorError when the tensor is not a DTensor.
const DTensorSpec& spec_of(const at::Tensor& dtensor);
const MeshPtr& mesh_of(const at::Tensor& dtensor);
const Placements& placements_of(const at::Tensor& dtensor);
// The local shard as stored: no autograd, no copy.
const at::Tensor& local_tensor_of(const at::Tensor& dtensor);

// "DTensor(shape=[8, 6], dtype=Float, placements=(S(0),R), mesh=DeviceMesh([[0, 1], [2, 3]]), local=[4, 6])"
std::string describe(const at::Tensor& dtensor);

}  // namespace dtensor
