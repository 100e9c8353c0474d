#pragma once
// DeviceMesh: an n-d grid of global ranks with optional dim names and one process group per mesh dim
// through this rank (the ranks that differ from it only along that dim). Slicing by name gives a
// sub-mesh that reuses those groups, so it costs no communication. Flattening a sub-mesh gives a 1-d
// mesh over several dims (one new group), which the mesh it was sliced from then slices by name too;
// unflattening splits a dim into several (PyTorch's DeviceMesh._flatten / _unflatten).

#include <c10/core/DeviceType.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/comm_backend.h"
#include "dtensor/layout.h"

namespace c10d {
class Backend;
}

namespace dtensor {
namespace detail {
class MeshGroup;
struct MeshFamily;
}

class World;
class DeviceMesh;
using MeshPtr = std::shared_ptr<const DeviceMesh>;

struct MeshOptions {
  std::vector<std::string> dim_names;  // empty, or one unique name per mesh dim
  c10::DeviceType device_type = c10::DeviceType::CPU;
  std::optional<std::chrono::milliseconds> timeout;    // collectives on this mesh; default: the world's
  // Who carries the collectives; Automatic is World::resolve's choice (MPI under mpirun, else Gloo, for
  // CPU; NCCL for CUDA).
  CommBackend backend = CommBackend::Automatic;
  // No process groups: the mesh only lays out ranks, for transforms that plan collectives without
  // running them (a graph transform of one rank's program, checked in one process). Any collective on
  // it raises an error.
  bool planning_only = false;
};

class DeviceMesh : public std::enable_shared_from_this<DeviceMesh> {
 public:
  // The world's ranks 0..N-1 laid out row-major in `shape`; N must equal the world size.
  static MeshPtr create(const std::shared_ptr<World>& world, const Shape& shape, MeshOptions options = {});
  // An explicit n-d array of global ranks (row-major, `ranks.size()` == product of `shape`), possibly a
  // subset of the world. Every rank of the world should construct the same meshes in the same order;
  // ranks outside the mesh get a mesh without a coordinate and without process groups.
  static MeshPtr create(const std::shared_ptr<World>& world, const Shape& shape, const std::vector<int64_t>& ranks,
                        MeshOptions options = {});
  // A mesh over process groups made elsewhere (PyTorch's DeviceMesh.from_group): `groups[d]` is the
  // group along mesh dim d through this rank, its members ordered by coordinate along d; `ranks` lays
  // out the global ranks as in create (for one group: its members in group order). This rank must be
  // in the mesh, and each group's size and rank must match the mesh. The mesh borrows the groups:
  // shutdown() and the end of the mesh drop them without shutting them down, as they are the caller's.
  static MeshPtr from_group(const std::shared_ptr<World>& world, std::vector<c10::intrusive_ptr<c10d::Backend>> groups,
                            const Shape& shape, const std::vector<int64_t>& ranks, MeshOptions options = {});
  static MeshPtr from_group(const std::shared_ptr<World>& world, c10::intrusive_ptr<c10d::Backend> group,
                            const std::vector<int64_t>& ranks, MeshOptions options = {});
  ~DeviceMesh();

  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t dim) const;
  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& ranks() const { return ranks_; }  // row-major
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  c10::DeviceType device_type() const { return device_type_; }
  CommBackend backend() const { return backend_; }  // resolved: never Automatic
  // The registered description of backend(), looked up once when the mesh is made (collectives read
  // it on every call).
  const CommBackendDescription& backend_description() const { return *backend_description_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::shared_ptr<World>& world() const { return world_; }
  bool planning_only() const { return planning_only_; }  // MeshOptions::planning_only

  // This rank's position in the grid; empty when the rank is not part of the mesh.
  const std::optional<Shape>& coordinate() const { return coordinate_; }
  bool contains_this_rank() const { return coordinate_.has_value(); }
  // This rank's coordinate along `dim` (its rank in that dim's group): PyTorch's get_local_rank. Throws
  // DTensorError when the rank is not in the mesh; the overload without a dim only for 1-d meshes.
  int64_t local_rank(int64_t dim) const;
  int64_t local_rank(const std::string& dim_name) const { return local_rank(dim_index(dim_name)); }
  int64_t local_rank() const;
  int64_t global_rank_at(const Shape& coordinate) const;

  // Index of a named dim; throws DTensorError listing the names when unknown.
  int64_t dim_index(const std::string& name) const;
  // The process group along `dim` through this rank (its members ordered by coordinate along `dim`).
  // Throws DTensorError once the mesh was shut down.
  c10::intrusive_ptr<c10d::Backend> group(int64_t dim) const;
  // The shared holder of that group (collectives use it to detect racing threads).
  detail::MeshGroup& group_holder(int64_t dim) const;

  // Releases this mesh's process groups now (its slices share them and lose them too); collectives on
  // it afterwards raise an error. Dropping the last handle to a mesh (and to its slices and DTensors)
  // releases them as well: dtensor's caches hold no mesh. (const: meshes are shared as const; what it
  // changes is the groups they share.)
  void shutdown() const;
  // Unique in the process (meshes of equal layout differ): what caches key on, as it is never reused.
  uint64_t id() const { return id_; }
  // "tp" or "dim 1" — how errors and plans refer to a mesh dim.
  std::string dim_label(int64_t dim) const;

  // The 1-d sub-mesh along a named dim through this rank, e.g. mesh["tp"].
  MeshPtr operator[](const std::string& name) const { return slice({name}); }
  // The sub-mesh over several named dims (kept in the given order) through this rank. A mesh made by
  // create, from_group or unflatten (a root) also slices the names of dims flattened from it, alone or
  // with its own dims (e.g. {"dp_replicate", "dp_shard_cp"}) as long as no two names cover one dim.
  MeshPtr slice(const std::vector<std::string>& names) const;

  // This mesh's dims as one (PyTorch's _flatten): a 1-d mesh over its ranks in row-major order, named
  // `name` (default: the dim names joined by "_"), with a new process group. Its root mesh slices it
  // by that name from then on. Every rank of the root must flatten the same dims in the same order.
  // Flattening the same dims again under the same name gives an equal mesh over the same group; a
  // 1-d mesh flattened under its own name is itself. Throws for a mesh without dim names, a name
  // that is a dim of the root, or one already given to other dims.
  MeshPtr flatten(const std::string& name = "") const;
  // Dim `dim` split into dims of `sizes` (product: its size) named `names`, row-major as view would
  // split it (PyTorch's _unflatten): e.g. a 1-d mesh of 8 into {2, 2, 2} ("dp", "cp", "tp"). The other
  // dims keep their groups; the new dims get new ones, so every rank of the mesh must unflatten in the
  // same order. The result is a root of its own (it slices its own flattened dims, not this mesh's).
  MeshPtr unflatten(int64_t dim, const Shape& sizes, const std::vector<std::string>& names) const;
  MeshPtr unflatten(const std::string& dim_name, const Shape& sizes, const std::vector<std::string>& names) const {
    return unflatten(dim_index(dim_name), sizes, names);
  }

  // A 1-d mesh over the union of this mesh's ranks and `other`'s (sorted), through which tensors move
  // between the two (cross-mesh redistribution), either way. Made on first use, when every rank of the
  // union must ask for it in the same order, and kept by both meshes (so it goes with them).
  MeshPtr bridge_to(const DeviceMesh& other) const;

  // Same ranks, shape and names.
  bool operator==(const DeviceMesh& other) const;
  bool operator!=(const DeviceMesh& other) const { return !(*this == other); }
  // "DeviceMesh([[0, 1], [2, 3]], names=(dp, tp))"
  std::string str() const;

 private:
  DeviceMesh(std::shared_ptr<World> world, Shape shape, std::vector<int64_t> ranks, MeshOptions options);
  // A validated mesh without process groups; `caller` names the function in errors.
  static std::shared_ptr<DeviceMesh> laid_out(const std::shared_ptr<World>& world, const Shape& shape,
                                              const std::vector<int64_t>& ranks, MeshOptions options, const std::string& caller);
  void create_groups();
  // A new group over the ranks through this one that differ only along `dims` (row-major).
  std::shared_ptr<detail::MeshGroup> new_group_along(const std::vector<int64_t>& dims) const;
  // This rank's coordinate with `dims` set to the `index`-th point of their sub-grid (row-major).
  Shape through_this_rank(const std::vector<int64_t>& dims, int64_t index) const;
  // A mesh of this one's root's family, on its world, device, backend and timeout, over `ranks` laid
  // out in `shape`; the caller gives it its root dims and groups.
  std::shared_ptr<DeviceMesh> relative(Shape shape, std::vector<int64_t> ranks, std::vector<std::string> names) const;
  // What slicing one name takes: this mesh's dims, the root's dims they span, and their group.
  struct Sliced {
    std::vector<int64_t> dims;
    std::vector<int64_t> root_dims;
    std::shared_ptr<detail::MeshGroup> group;
  };
  Sliced sliced_dim(const std::string& name) const;
  bool is_root() const { return root_dims_.empty(); }

  std::shared_ptr<World> world_;
  Shape shape_;
  std::vector<int64_t> ranks_;
  std::vector<std::string> dim_names_;
  c10::DeviceType device_type_;
  CommBackend backend_;
  const CommBackendDescription* backend_description_;
  std::chrono::milliseconds timeout_;
  std::optional<Shape> coordinate_;
  std::vector<std::shared_ptr<detail::MeshGroup>> groups_;
  uint64_t id_;
  bool planning_only_;
  // The root this mesh was sliced or flattened from shares its family: the dims flattened from it.
  std::shared_ptr<detail::MeshFamily> family_;
  // For each dim, the root's dims it spans (row-major); empty for a root, whose dims are its own.
  std::vector<std::vector<int64_t>> root_dims_;
  mutable std::mutex bridges_mutex_;
  mutable std::map<std::vector<int64_t>, MeshPtr> bridges_;  // by the union's ranks
};

bool same_mesh(const MeshPtr& a, const MeshPtr& b);

}  // namespace dtensor
