#include "dtensor/local_map.h"

#include "../mesh/collectives.h"
#include "dtensor/api.h"
#include "dtensor/errors.h"

namespace dtensor {
namespace {

// The mesh every DTensor argument is on (`given`, or the first one's), or null with no DTensor.
MeshPtr common_mesh(const std::vector<at::Tensor>& args, const MeshPtr& given) {
  MeshPtr found;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!is_dtensor(args[i])) continue;
    const MeshPtr& m = mesh_of(args[i]);
    if (!found) found = given ? given : m;
    if (!same_mesh(found, m))
      throw DTensorError("local_map: argument " + std::to_string(i) + " is on " + m->str() + ", not on " + found->str());
  }
  return found;
}

// An optional per-input entry: nullopt when the list or the entry is absent.
const std::optional<Placements>& entry(const std::optional<PlacementsPerInput>& list, size_t i) {
  static const std::optional<Placements> none;
  return list ? (*list)[i] : none;
}

// Argument `i` as fn sees it: a DTensor's shard, in the placements fn expects.
at::Tensor local_argument(const at::Tensor& arg, size_t i, const std::optional<PlacementsPerInput>& in_placements,
                          bool redistribute_inputs, const std::optional<Placements>& grad_placements) {
  if (!is_dtensor(arg)) return arg;
  if (!in_placements) return to_local(arg, grad_placements);
  const std::optional<Placements>& wanted = (*in_placements)[i];
  if (!wanted)
    throw DTensorError("local_map: argument " + std::to_string(i) + " is a DTensor (" + describe(arg) +
                       ") but its in_placements entry is empty; give the placements fn expects");
  const MeshPtr& mesh = mesh_of(arg);
  const Placements p = validate_placements(*wanted, mesh->ndim(), arg.dim(), "local_map in_placements");
  if (p == placements_of(arg)) return to_local(arg, grad_placements);
  if (!redistribute_inputs)
    throw DTensorError("local_map: argument " + std::to_string(i) + " has placements (" + to_string(placements_of(arg)) +
                       ") but fn expects (" + to_string(p) + "); redistribute it, or pass redistribute_inputs = true");
  return to_local(redistribute(arg, p), grad_placements);
}

// The global shape of a tensor whose shard on this rank is `local`: along every Shard mesh dim the
// group's shard sizes add up (innermost mesh dim first, undoing the order shards are cut in).
Shape global_shape(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements) {
  Shape shape = local.sizes().vec();
  if (!mesh.coordinate()) return shape;  // ranks outside the mesh hold no shard
  for (int64_t m = mesh.ndim() - 1; m >= 0; --m) {
    if (!placements[m].is_sharding()) continue;
    const auto d = static_cast<size_t>(placements[m].dim());
    int64_t total = 0;
    for (int64_t size : detail::all_gather_values(mesh, m, {shape[d]})) total += size;
    shape[d] = total;
  }
  return shape;
}

at::Tensor wrap_output(const at::Tensor& local, const MeshPtr& mesh, const Placements& placements) {
  if (!local.defined()) return local;
  const Placements p = validate_placements(placements, mesh->ndim(), local.dim(), "local_map out_placements");
  FromLocalOptions options{.run_check = false};
  options.shape = global_shape(local, *mesh, p);
  options.stride = global_stride_like(*options.shape, local.sizes().vec(), local.strides().vec());
  return from_local(local, mesh, p, options);
}

}  // namespace

LocalFunction local_map(LocalFunction fn, std::vector<Placements> out_placements,
                        std::optional<PlacementsPerInput> in_placements, bool redistribute_inputs, MeshPtr mesh,
                        std::optional<PlacementsPerInput> in_grad_placements) {
  return [fn = std::move(fn), out_placements = std::move(out_placements), in_placements = std::move(in_placements),
          redistribute_inputs, mesh = std::move(mesh),
          in_grad_placements = std::move(in_grad_placements)](const std::vector<at::Tensor>& args) {
    for (const auto* list : {&in_placements, &in_grad_placements})
      if (*list && (*list)->size() != args.size())
        throw DTensorError("local_map: got " + std::to_string(args.size()) + " argument(s) but " +
                           std::to_string((*list)->size()) + " entries in " +
                           (list == &in_placements ? "in_placements" : "in_grad_placements"));
    const MeshPtr on = common_mesh(args, mesh);
    std::vector<at::Tensor> locals;
    for (size_t i = 0; i < args.size(); ++i)
      locals.push_back(local_argument(args[i], i, in_placements, redistribute_inputs, entry(in_grad_placements, i)));
    std::vector<at::Tensor> outs = fn(locals);
    if (!on) return outs;  // plain tensors in, plain tensors out
    if (outs.size() != out_placements.size())
      throw DTensorError("local_map: fn returned " + std::to_string(outs.size()) + " tensor(s) but " +
                         std::to_string(out_placements.size()) + " out_placements were given");
    for (size_t k = 0; k < outs.size(); ++k) outs[k] = wrap_output(outs[k], on, out_placements[k]);
    return outs;
  };
}

}  // namespace dtensor
