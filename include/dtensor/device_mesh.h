#pragma once
// DeviceMesh: an n-d grid of global ranks with optional dim names and one process group per mesh dim
// through this rank (the ranks that differ from it only along that dim). Slicing by name gives a
// sub-mesh that reuses those groups, so it costs no communication.

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

class DeviceMesh {
 public:
  // The world's ranks 0..N-1 laid out row-major in `shape`; N must equal the world size.
  static MeshPtr create(const std::shared_ptr<World>& world, const Shape& shape, MeshOptions options = {});
  // An explicit n-d array of global ranks (row-major, `ranks.size()` == product of `shape`), possibly a
  // subset of the world. Every rank of the world should construct the same meshes in the same order;
  // ranks outside the mesh get a mesh without a coordinate and without process groups.
  static MeshPtr create(const std::shared_ptr<World>& world, const Shape& shape, const std::vector<int64_t>& ranks,
                        MeshOptions options = {});
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
  // The sub-mesh over several named dims (kept in the given order) through this rank.
  MeshPtr slice(const std::vector<std::string>& names) const;

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
  void create_groups();

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
  mutable std::mutex bridges_mutex_;
  mutable std::map<std::vector<int64_t>, MeshPtr> bridges_;  // by the union's ranks
};

bool same_mesh(const MeshPtr& a, const MeshPtr& b);

}  // namespace dtensor
