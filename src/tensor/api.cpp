#include "dtensor/api.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "../mesh/collectives.h"
#include "../redistribute/cross_mesh.h"
#include "../redistribute/executor.h"
#include "autograd_nodes.h"
#include "pending_local.h"
#include "donation.h"
#include "dtensor/errors.h"
#include "dtensor/world.h"

namespace dtensor {
namespace {

void require_mesh(const MeshPtr& mesh, const char* what) {
  if (!mesh) throw DTensorError(std::string(what) + ": the mesh is null; build one with DeviceMesh::create");
}

// This rank's chunk along tensor dim `d` of `whole`, scattered from the member at coordinate 0 of
// mesh dim `m` (padded to equal chunks on the wire, as uneven torch.chunk pieces cannot be scattered).
at::Tensor scatter_chunk(const at::Tensor& whole, const DeviceMesh& mesh, int64_t m, int64_t d) {
  const int64_t n = mesh.size(m), length = whole.size(d), me = (*mesh.coordinate())[m];
  const int64_t rows = padded_chunk_size(length, n);
  at::Tensor moved = whole.movedim(d, 0);
  std::vector<at::Tensor> chunks;
  if (me == 0) {
    for (int64_t q = 0; q < n; ++q) {
      const ChunkExtent c = chunk_extent(length, n, q);
      chunks.push_back(detail::padded_rows(moved.narrow(0, c.offset, c.size), rows));
    }
  }
  auto sizes = moved.sizes().vec();
  sizes[0] = rows;
  at::Tensor received = at::empty(sizes, whole.options());
  detail::scatter_(mesh, m, chunks, received);
  return received.narrow(0, 0, chunk_extent(length, n, me).size).movedim(0, d).contiguous();
}

at::Tensor broadcast_copy(const at::Tensor& local, const DeviceMesh& mesh, int64_t m) {
  at::Tensor copy = local.clone(at::MemoryFormat::Contiguous);  // never overwrite the caller's tensor
  detail::broadcast_(mesh, m, copy);
  return copy;
}

std::string rank_list(const DeviceMesh& mesh, int64_t m, const std::vector<Shape>& shapes) {
  std::string s;
  Shape coord = *mesh.coordinate();
  for (size_t q = 0; q < shapes.size(); ++q) {
    coord[m] = static_cast<int64_t>(q);
    s += (q ? ", " : "") + std::string("rank ") + std::to_string(mesh.global_rank_at(coord)) + " has " +
         shape_str(shapes[q]);
  }
  return s;
}

// Exchanges local shapes along every mesh dim (innermost first, so nested shards add up in the
// order they were cut) and returns the exact global shape. Every member of the mesh learns of a
// mismatch found anywhere (a second round spreads a failure flag over all dims), so all of them throw
// instead of some waiting in a later collective.
Shape checked_global_shape(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements) {
  Shape current = local.sizes().vec();
  std::string error;
  int64_t failed_rank = -1;
  const int64_t me = mesh.world()->rank();
  for (int64_t m = mesh.ndim() - 1; m >= 0; --m) {
    Shape values = current;
    values.push_back(static_cast<int64_t>(local.scalar_type()));
    values.push_back(error.empty() ? failed_rank : me);
    const auto all = detail::all_gather_values(mesh, m, values);
    const size_t k = values.size(), n = static_cast<size_t>(mesh.size(m));
    std::vector<Shape> shapes;
    for (size_t q = 0; q < n; ++q) {
      shapes.emplace_back(all.begin() + q * k, all.begin() + q * k + current.size());
      if (all[q * k + k - 2] != values[k - 2] && error.empty())
        error = "ranks along " + mesh.dim_label(m) + " hold local tensors of different dtypes";
      if (all[q * k + k - 1] >= 0) failed_rank = all[q * k + k - 1];
    }
    if (!error.empty() || failed_rank >= 0) continue;  // one report per failure: the rank that saw it
    const Placement& p = placements[m];
    Shape merged = current;
    if (p.is_sharding()) {
      const auto d = static_cast<size_t>(p.dim());
      int64_t total = 0;
      for (auto& s : shapes) total += s[d];
      merged[d] = total;
      const bool whole_blocks = total % (p.is_head_tail_shard() ? 2 * static_cast<int64_t>(n) : p.split_factor()) == 0;
      for (size_t q = 0; q < n && error.empty(); ++q) {
        Shape expected = merged;
        if (whole_blocks) expected[d] = sharded_size(p, total, static_cast<int64_t>(n), static_cast<int64_t>(q));
        if (shapes[q] != expected || !whole_blocks)
          error = "local shapes along " + mesh.dim_label(m) + " (" + p.str() + ") are not torch.chunk pieces of one " +
                  "tensor of " + shape_str(merged) + (p.is_strided_shard() ? " (of each of its blocks)" : "") +
                  (p.is_head_tail_shard() ? " (two equal chunks each, 2 x ranks in all)" : "") + ": " +
                  rank_list(mesh, m, shapes);
      }
    } else {
      for (size_t q = 0; q < n && error.empty(); ++q)
        if (shapes[q] != current)
          error = "local shapes along " + mesh.dim_label(m) + " (" + p.str() + ") must be equal: " +
                  rank_list(mesh, m, shapes);
    }
    current = merged;
  }
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    const auto all = detail::all_gather_values(mesh, m, {error.empty() ? failed_rank : me});
    for (auto r : all)
      if (r >= 0) failed_rank = r;
  }
  if (!error.empty()) throw DTensorError("from_local(run_check): " + error + "; fix the shards or the placements");
  if (failed_rank >= 0)
    throw DTensorError("from_local(run_check): rank " + std::to_string(failed_rank) +
                       " found local shapes or dtypes that do not fit the placements (see its error)");
  return current;
}

}  // namespace

at::Tensor distribute_tensor(const at::Tensor& tensor, const MeshPtr& mesh, std::optional<Placements> placements) {
  require_mesh(mesh, "distribute_tensor");
  if (!tensor.defined()) throw DTensorError("distribute_tensor: the tensor is undefined");
  Placements wanted = validate_placements(placements.value_or(Placements(mesh->ndim(), Replicate())), mesh->ndim(),
                                          tensor.dim(), "distribute_tensor");
  if (is_dtensor(tensor)) {
    const DTensorSpec& spec = dtensor_impl(tensor).spec();
    if (!same_mesh(spec.mesh, mesh))
      throw DTensorError("distribute_tensor: the tensor is already a DTensor on " + spec.mesh->str() +
                         ", not on " + mesh->str() + "; moving between meshes is not supported");
    if (spec.placements != wanted)
      throw DTensorError("distribute_tensor: the tensor is already a DTensor with placements (" +
                         to_string(spec.placements) + "); call redistribute(tensor, {" + to_string(wanted) +
                         "}) to change them");
    return tensor;
  }
  if (!tensor.is_leaf())
    throw DTensorError("distribute_tensor expects a leaf tensor (such as a parameter) but got the output of " +
                       tensor.grad_fn()->name() + "; inside an autograd graph use from_local on each rank's shard");
  TensorMeta meta{tensor.sizes().vec(), tensor.strides().vec(), tensor.scalar_type()};
  at::Tensor local = tensor.detach();
  if (!mesh->coordinate()) {
    local = at::empty({0}, tensor.options());
  } else {
    for (int64_t m = 0; m < mesh->ndim(); ++m) {
      const Placement& p = wanted[m];
      if (p.is_shard()) {
        local = scatter_chunk(local, *mesh, m, p.dim());
      } else if (p.is_multi_run_shard()) {
        // The source's copy on every rank, and this rank's runs of it.
        local = detail::strided_chunk(broadcast_copy(local, *mesh, m), p, *mesh, m);
      } else {
        local = broadcast_copy(local, *mesh, m);
        if (p.is_partial())
          local = detail::partition_replicated(local, *mesh, m, p.reduce_op(), detail::Direction::Forward);
      }
    }
  }
  local = in_global_layout(local, meta);
  at::Tensor out = make_dtensor(local, DTensorSpec{mesh, std::move(wanted), std::move(meta)});
  if (tensor.requires_grad()) out.set_requires_grad(true);
  return out;
}

at::Tensor from_local(const at::Tensor& local, const MeshPtr& mesh, const Placements& placements,
                      const FromLocalOptions& options) {
  require_mesh(mesh, "from_local");
  if (!local.defined()) throw DTensorError("from_local: the local tensor is undefined");
  if (is_dtensor(local))
    throw DTensorError("from_local expects this rank's plain local tensor but got a DTensor (" +
                       dtensor_impl(local).spec().str() + "); use redistribute to change its placements");
  if (options.shape.has_value() != options.stride.has_value())
    throw DTensorError(std::string("from_local: got a ") + (options.shape ? "shape" : "stride") + " without a " +
                       (options.shape ? "stride" : "shape") + "; pass both (the global shape and stride) or neither");
  const Placements p = validate_placements(placements, mesh->ndim(), local.dim(), "from_local");
  if (options.shape && options.shape->size() != options.stride->size())
    throw DTensorError("from_local: shape " + shape_str(*options.shape) + " and stride " + shape_str(*options.stride) +
                       " have different lengths");

  TensorMeta meta;
  meta.dtype = local.scalar_type();
  at::Tensor data = alias_without_history(local);
  if (!mesh->coordinate()) {
    meta.shape = options.shape.value_or(local.sizes().vec());
    data = at::empty({0}, local.options());
  } else {
    if (options.run_check) {
      meta.shape = checked_global_shape(data, *mesh, p);
      if (options.shape && *options.shape != meta.shape)
        throw DTensorError("from_local: the given shape " + shape_str(*options.shape) +
                           " differs from the global shape the ranks' shards form, " + shape_str(meta.shape));
      for (int64_t m = 0; m < mesh->ndim(); ++m) {
        if (!p[m].is_replicate()) continue;
        if (!data.is_contiguous()) data = data.contiguous();
        detail::broadcast_(*mesh, m, data);  // in place: the DTensor keeps sharing the caller's memory
      }
    } else {
      meta.shape = options.shape.value_or(global_shape_assuming_even(local.sizes().vec(), mesh->shape(), p));
    }
    const Shape expected = local_shape(meta.shape, mesh->shape(), *mesh->coordinate(), p);
    if (expected != local.sizes().vec())
      throw DTensorError("from_local: the local tensor's shape " + shape_str(local.sizes().vec()) +
                         " is not this rank's shard " + shape_str(expected) + " of a global " + shape_str(meta.shape) +
                         " tensor with placements (" + to_string(p) + "); pass the right shape or use run_check");
  }
  meta.stride = options.stride.value_or(global_stride_like(meta.shape, local.sizes().vec(), local.strides().vec()));
  // Given strides in another dim order than the local tensor's: the DTensor gets its own copy.
  data = in_global_layout(data, meta);
  auto spec = std::make_shared<const DTensorSpec>(DTensorSpec{mesh, p, std::move(meta)});
  at::Tensor out = make_dtensor(data, spec);
  detail::record(detail::make_node<detail::FromLocalBackward>(std::move(spec)), local, out);
  return out;
}

at::Tensor to_local(const at::Tensor& dtensor, std::optional<Placements> grad_placements) {
  const auto& impl = dtensor_impl(dtensor, "to_local");
  at::Tensor out = alias_without_history(impl.local());
  if (torch::autograd::GradMode::is_enabled() && dtensor.requires_grad()) {
    const DTensorSpec& spec = impl.spec();
    std::shared_ptr<const DTensorSpec> grad_spec = impl.shared_spec();
    if (grad_placements) {
      Placements grad = validate_placements(*grad_placements, spec.mesh->ndim(), spec.ndim(), "to_local(grad_placements)");
      if (grad != spec.placements) grad_spec = std::make_shared<const DTensorSpec>(spec.with_placements(std::move(grad)));
    }
    // With the forward's placements the gradient's shard has the forward shard's shape.
    const at::DimVector local_shape = grad_spec == impl.shared_spec() ? at::DimVector(impl.local().sizes())
                                                                       : at::DimVector(grad_spec->local_shape());
    detail::record(detail::make_node<detail::ToLocalBackward>(std::move(grad_spec), local_shape), dtensor, out);
  }
  return out;
}

RedistributePlan redistribute_plan(const at::Tensor& dtensor, const Placements& placements) {
  const DTensorSpec& spec = dtensor_impl(dtensor, "redistribute_plan").spec();
  if (!spec.mesh->coordinate()) return RedistributePlan{spec.placements, placements, {}};
  return detail::cached_plan(spec, validate_placements(placements, spec.mesh->ndim(), spec.ndim(), "redistribute_plan"));
}

namespace {

// `placements` checked as a redistribute target for `spec` on `mesh` (its own when null).
Placements redistribute_target(const DTensorSpec& spec, const MeshPtr& mesh, const Placements& placements) {
  const DeviceMesh& target_mesh = mesh ? *mesh : *spec.mesh;
  Placements target = validate_placements(placements, target_mesh.ndim(), spec.ndim(), "redistribute");
  const bool same = !mesh || same_mesh(mesh, spec.mesh);
  for (size_t m = 0; m < target.size(); ++m) {
    if (target[m].is_partial() && (!same || target[m] != spec.placements[m]))
      throw DTensorError("redistribute: cannot move " + target_mesh.dim_label(static_cast<int64_t>(m)) +
                         (same ? " from " + spec.placements[m].str() + " to " + target[m].str()
                               : " to " + target[m].str() + " on another mesh") +
                         ": Partial is a state ops produce, not a target; choose Shard or Replicate");
  }
  return target;
}

// To a mesh with other ranks or another shape: Partial mesh dims are reduced on the source mesh, then
// exactly the overlapping index ranges move between the ranks of both.
at::Tensor redistribute_across_meshes(const at::Tensor& dtensor, const MeshPtr& mesh, const Placements& target) {
  const DTensorSpec& spec = dtensor_impl(dtensor).spec();
  const Placements reduced = partial_as_replicate(spec.placements);
  const at::Tensor source = reduced == spec.placements ? dtensor : redistribute(dtensor, nullptr, reduced);
  const auto& impl = dtensor_impl(source);
  const DTensorSpec to{mesh, target, impl.spec().meta};
  at::Tensor local = detail::move_across_meshes(impl.local(), impl.spec(), to);
  at::Tensor out = make_dtensor(in_global_layout(local, to.meta), to);
  detail::record(detail::make_node<detail::CrossMeshRedistributeBackward>(impl.spec()), source, out);
  return out;
}

at::Tensor redistribute_to(const at::Tensor& dtensor, const Placements& target, detail::Ownership ownership) {
  const auto& impl = dtensor_impl(dtensor);
  const DTensorSpec& spec = impl.spec();
  at::Tensor local = detail::redistribute_local(impl.local(), spec, target, detail::Direction::Forward, ownership);
  at::Tensor out = make_dtensor(in_global_layout(local, spec.meta), spec.with_placements(target));
  detail::record(detail::make_node<detail::RedistributeBackward>(spec), dtensor, out);
  return out;
}

}  // namespace

at::Tensor redistribute(const at::Tensor& dtensor, const MeshPtr& mesh, const Placements& placements) {
  const DTensorSpec& spec = dtensor_impl(dtensor, "redistribute").spec();
  const Placements target = redistribute_target(spec, mesh, placements);
  if (mesh && !same_mesh(mesh, spec.mesh)) return redistribute_across_meshes(dtensor, mesh, target);
  if (target == spec.placements) return dtensor;
  return redistribute_to(dtensor, target, detail::Ownership::Borrowed);
}

at::Tensor redistribute(at::Tensor&& dtensor, const MeshPtr& mesh, const Placements& placements) {
  const DTensorSpec& spec = dtensor_impl(dtensor, "redistribute").spec();
  const Placements target = redistribute_target(spec, mesh, placements);
  if (mesh && !same_mesh(mesh, spec.mesh)) return redistribute_across_meshes(std::move(dtensor), mesh, target);
  if (target == spec.placements) return std::move(dtensor);
  const at::Tensor owned = std::move(dtensor);  // consumed whether or not it can be donated
  return redistribute_to(owned, target, detail::donatable(owned) ? detail::Ownership::Donated : detail::Ownership::Borrowed);
}

at::Tensor redistribute(const at::Tensor& dtensor, const MeshPtr& mesh, const Placements& placements,
                        const RedistributeOptions& options) {
  if (!options.async_op) return redistribute(dtensor, mesh, placements);
  const auto& impl = dtensor_impl(dtensor, "redistribute");
  const DTensorSpec& spec = impl.spec();
  const Placements target = redistribute_target(spec, mesh, placements);
  if (mesh && !same_mesh(mesh, spec.mesh)) return redistribute_across_meshes(dtensor, mesh, target);
  if (target == spec.placements) return dtensor;
  auto started = detail::start_redistribute_local(impl.local(), spec, target);
  auto out_spec = std::make_shared<const DTensorSpec>(spec.with_placements(target));
  at::Tensor out = started.finish ? detail::make_pending_dtensor(std::move(out_spec), impl.local().options(),
                                                                 [finish = std::move(started.finish), meta = spec.meta] {
                                                                   return in_global_layout(finish(), meta);
                                                                 })
                                  : make_dtensor(in_global_layout(started.done, spec.meta), std::move(out_spec));
  detail::record(detail::make_node<detail::RedistributeBackward>(spec), dtensor, out);
  return out;
}

at::Tensor full_tensor(const at::Tensor& dtensor, std::optional<Placements> grad_placements) {
  const DTensorSpec& spec = dtensor_impl(dtensor, "full_tensor").spec();
  return to_local(redistribute(dtensor, nullptr, Placements(spec.mesh->ndim(), Replicate())), std::move(grad_placements));
}

const DTensorSpec& spec_of(const at::Tensor& dtensor) { return dtensor_impl(dtensor, "spec_of").spec(); }
const MeshPtr& mesh_of(const at::Tensor& dtensor) { return spec_of(dtensor).mesh; }
const Placements& placements_of(const at::Tensor& dtensor) { return spec_of(dtensor).placements; }
const at::Tensor& local_tensor_of(const at::Tensor& dtensor) { return dtensor_impl(dtensor, "local_tensor_of").local(); }

std::string describe(const at::Tensor& dtensor) {
  const auto& impl = dtensor_impl(dtensor, "describe");
  return "DTensor(" + impl.spec().str() + ", local=" + shape_str(impl.local().sizes().vec()) + ")";
}

}  // namespace dtensor

namespace dtensor::detail {

bool donatable(const at::Tensor& dtensor) {
  const at::Tensor& local = dtensor_impl(dtensor).local();
  return dtensor.use_count() == 1 && local.use_count() == 1 && local.has_storage() && local.storage().use_count() == 1;
}

}  // namespace dtensor::detail
