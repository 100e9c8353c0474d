#include "dtensor/device_mesh.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>

#include "dtensor/errors.h"
#include "dtensor/world.h"
#include "mesh_family.h"
#include "mesh_group.h"

namespace dtensor {
namespace {

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// Row-major nested list: [[0, 1], [2, 3]].
std::string nested(const Shape& shape, const std::vector<int64_t>& ranks, size_t dim, size_t& pos) {
  if (dim == shape.size()) return std::to_string(ranks[pos++]);
  std::string s = "[";
  for (int64_t i = 0; i < shape[dim]; ++i) s += (i ? ", " : "") + nested(shape, ranks, dim + 1, pos);
  return s + "]";
}

}  // namespace

MeshPtr DeviceMesh::create(const std::shared_ptr<World>& world, const Shape& shape, MeshOptions options) {
  if (!world) throw DTensorError("DeviceMesh::create: world is null; build one with World::from_environment()");
  if (numel(shape) != world->size()) {
    throw DTensorError("DeviceMesh::create: a mesh of shape [" + join(shape) + "] holds " + std::to_string(numel(shape)) +
                       " ranks but the world has " + std::to_string(world->size()) +
                       "; pick a shape whose product is the world size, or pass the ranks explicitly");
  }
  std::vector<int64_t> ranks(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int64_t>(i);
  return create(world, shape, ranks, std::move(options));
}

MeshPtr DeviceMesh::create(const std::shared_ptr<World>& world, const Shape& shape, const std::vector<int64_t>& ranks,
                           MeshOptions options) {
  std::shared_ptr<DeviceMesh> mesh = laid_out(world, shape, ranks, std::move(options), "DeviceMesh::create");
  if (!mesh->planning_only_) mesh->create_groups();
  return mesh;
}

std::shared_ptr<DeviceMesh> DeviceMesh::laid_out(const std::shared_ptr<World>& world, const Shape& shape,
                                                 const std::vector<int64_t>& ranks, MeshOptions options, const std::string& caller) {
  if (!world) throw DTensorError(caller + ": world is null; build one with World::from_environment()");
  const std::string what = caller + "(shape [" + join(shape) + "], ranks [" + join(ranks) + "])";
  if (shape.empty()) throw DTensorError(what + ": a mesh needs at least one dimension");
  for (auto s : shape)
    if (s <= 0) throw DTensorError(what + ": every mesh dim must have a positive size");
  if (static_cast<int64_t>(ranks.size()) != numel(shape))
    throw DTensorError(what + ": " + std::to_string(ranks.size()) + " ranks do not fill a mesh of " +
                       std::to_string(numel(shape)) + " positions");
  if (std::set<int64_t>(ranks.begin(), ranks.end()).size() != ranks.size())
    throw DTensorError(what + ": a rank appears more than once; each rank may hold one position");
  for (auto r : ranks)
    if (r < 0 || r >= world->size())
      throw DTensorError(what + ": rank " + std::to_string(r) + " is not in the world of " +
                         std::to_string(world->size()) + " ranks");
  if (!options.dim_names.empty()) {
    if (options.dim_names.size() != shape.size())
      throw DTensorError(what + ": " + std::to_string(options.dim_names.size()) + " dim names for " +
                         std::to_string(shape.size()) + " mesh dims; give one name per dim or none");
    if (std::set<std::string>(options.dim_names.begin(), options.dim_names.end()).size() != options.dim_names.size())
      throw DTensorError(what + ": dim names must be unique");
  }
  return std::shared_ptr<DeviceMesh>(new DeviceMesh(world, shape, ranks, std::move(options)));
}

DeviceMesh::DeviceMesh(std::shared_ptr<World> world, Shape shape, std::vector<int64_t> ranks, MeshOptions options)
    : world_(std::move(world)),
      shape_(std::move(shape)),
      ranks_(std::move(ranks)),
      dim_names_(std::move(options.dim_names)),
      device_type_(options.device_type),
      backend_(world_->resolve(options.backend, options.device_type)),
      backend_description_(&comm_backend_description(backend_)),
      timeout_(options.timeout.value_or(world_->timeout())),
      planning_only_(options.planning_only),
      family_(std::make_shared<detail::MeshFamily>()) {
  family_->root_dim_names = dim_names_;
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id++;
  const auto me = std::find(ranks_.begin(), ranks_.end(), world_->rank());
  if (me == ranks_.end()) return;
  Shape coord(shape_.size());
  int64_t flat = me - ranks_.begin();
  for (size_t d = shape_.size(); d-- > 0;) {
    coord[d] = flat % shape_[d];
    flat /= shape_[d];
  }
  coordinate_ = std::move(coord);
}

DeviceMesh::~DeviceMesh() = default;

void DeviceMesh::create_groups() {
  if (!coordinate_) return;
  // Dims in order, on every member: a group along dim d only waits for peers that finished dim d-1.
  for (int64_t d = 0; d < ndim(); ++d) groups_.push_back(new_group_along({d}));
}

std::shared_ptr<detail::MeshGroup> DeviceMesh::new_group_along(const std::vector<int64_t>& dims) const {
  Shape along;
  for (auto d : dims) along.push_back(shape_[d]);
  std::vector<int64_t> members;
  for (int64_t n = 0; n < numel(along); ++n) members.push_back(global_rank_at(through_this_rank(dims, n)));
  try {
    return world_->new_mesh_group(members, device_type_, timeout_, backend_);
  } catch (const DTensorError& e) {
    // Which mesh and dims the failed group was for, in front of the world's account of why.
    std::string why = e.what();
    if (why.starts_with("dtensor: ")) why.erase(0, 9);
    std::string label;
    for (auto d : dims) label += (label.empty() ? "" : " x ") + dim_label(d);
    throw DTensorError("creating " + label + " of " + str() + ": " + why);
  }
}

Shape DeviceMesh::through_this_rank(const std::vector<int64_t>& dims, int64_t index) const {
  Shape c = *coordinate_;
  for (size_t k = dims.size(); k-- > 0;) {
    const auto d = static_cast<size_t>(dims[k]);
    c[d] = index % shape_[d];
    index /= shape_[d];
  }
  return c;
}

int64_t DeviceMesh::size(int64_t dim) const {
  if (dim < 0 || dim >= ndim())
    throw DTensorError("mesh dim " + std::to_string(dim) + " is out of range for " + str());
  return shape_[dim];
}

int64_t DeviceMesh::global_rank_at(const Shape& coordinate) const {
  int64_t flat = 0;
  for (size_t d = 0; d < shape_.size(); ++d) flat = flat * shape_[d] + coordinate[d];
  return ranks_[static_cast<size_t>(flat)];
}

int64_t DeviceMesh::dim_index(const std::string& name) const {
  const auto it = std::find(dim_names_.begin(), dim_names_.end(), name);
  if (it == dim_names_.end()) {
    std::string known;
    for (const auto& n : dim_names_) known += (known.empty() ? "" : ", ") + n;
    throw DTensorError("mesh dim '" + name + "' does not exist in " + str() +
                       (dim_names_.empty() ? "; the mesh has no dim names (set MeshOptions::dim_names)"
                                           : "; its dims are: " + known));
  }
  return it - dim_names_.begin();
}

detail::MeshGroup& DeviceMesh::group_holder(int64_t dim) const {
  if (!coordinate_)
    throw DTensorError("rank " + std::to_string(world_->rank()) + " is not part of " + str() + ", so it has no process groups");
  if (planning_only_)
    throw DTensorError(str() + " is for planning only (MeshOptions::planning_only): it has no process groups to run a collective on " +
                       dim_label(dim));
  return *groups_.at(static_cast<size_t>(dim));
}

c10::intrusive_ptr<c10d::Backend> DeviceMesh::group(int64_t dim) const {
  return group_holder(dim).backend(
      [&] { return "rank " + std::to_string(world_->rank()) + ", " + dim_label(dim) + " of " + str(); });
}

void DeviceMesh::shutdown() const {
  for (const auto& g : groups_) g->shutdown();
  if (!is_root()) return;
  std::lock_guard<std::mutex> lock(family_->mutex);
  for (const auto& [name, flat] : family_->flattened)
    if (flat.group) flat.group->shutdown();
}

std::string DeviceMesh::dim_label(int64_t dim) const {
  std::string s = "mesh dim " + std::to_string(dim);
  if (!dim_names_.empty()) s += " (" + dim_names_[static_cast<size_t>(dim)] + ")";
  return s;
}

DeviceMesh::Sliced DeviceMesh::sliced_dim(const std::string& name) const {
  const auto own = std::find(dim_names_.begin(), dim_names_.end(), name);
  if (own != dim_names_.end()) {
    const int64_t d = own - dim_names_.begin();
    return {{d}, is_root() ? std::vector<int64_t>{d} : root_dims_[static_cast<size_t>(d)],
            groups_.empty() ? nullptr : groups_[static_cast<size_t>(d)]};
  }
  std::string known;
  for (const auto& n : dim_names_) known += (known.empty() ? "" : ", ") + n;
  if (is_root()) {
    std::lock_guard<std::mutex> lock(family_->mutex);
    const auto flat = family_->flattened.find(name);
    if (flat != family_->flattened.end()) return {flat->second.root_dims, flat->second.root_dims, flat->second.group};
    for (const auto& [n, f] : family_->flattened) known += ", " + n + " (flattened)";
  }
  throw DTensorError("DeviceMesh::slice: mesh dim '" + name + "' does not exist in " + str() +
                     (known.empty() ? "; the mesh has no dim names (set MeshOptions::dim_names)" : "; its dims are: " + known) +
                     (is_root() ? "" : ". Dims flattened from the mesh this one was sliced from are sliced from that mesh"));
}

MeshPtr DeviceMesh::slice(const std::vector<std::string>& names) const {
  if (names.empty()) throw DTensorError("DeviceMesh::slice: give at least one dim name");
  if (!coordinate_)
    throw DTensorError("rank " + std::to_string(world_->rank()) + " is not part of " + str() + " and cannot slice it");
  std::vector<Sliced> picked;
  std::map<int64_t, std::string> covered;  // this mesh's dims, by the name that took them
  Shape sub_shape;
  for (const auto& name : names) {
    picked.push_back(sliced_dim(name));
    int64_t size = 1;
    for (auto d : picked.back().dims) {
      const auto [taken, fresh] = covered.emplace(d, name);
      if (!fresh && taken->second == name) throw DTensorError("DeviceMesh::slice: the dim name '" + name + "' is repeated");
      if (!fresh)
        throw DTensorError("DeviceMesh::slice: '" + taken->second + "' and '" + name + "' both cover " + dim_label(d) + " of " +
                           str() + "; name each dim once");
      size *= shape_[static_cast<size_t>(d)];
    }
    sub_shape.push_back(size);
  }
  // Enumerate the sub-grid through this rank: vary the picked dims, fix the others at our coordinate.
  std::vector<int64_t> sub_ranks;
  Shape sub_index(picked.size(), 0);
  for (int64_t n = 0; n < numel(sub_shape); ++n) {
    Shape c = *coordinate_;
    for (size_t k = 0; k < picked.size(); ++k) {
      const Shape part = through_this_rank(picked[k].dims, sub_index[k]);
      for (auto d : picked[k].dims) c[static_cast<size_t>(d)] = part[static_cast<size_t>(d)];
    }
    sub_ranks.push_back(global_rank_at(c));
    for (size_t k = picked.size(); k-- > 0;) {
      if (++sub_index[k] < sub_shape[k]) break;
      sub_index[k] = 0;
    }
  }
  std::shared_ptr<DeviceMesh> sub = relative(std::move(sub_shape), std::move(sub_ranks), names);
  for (const auto& p : picked) {
    sub->root_dims_.push_back(p.root_dims);
    if (!planning_only_) sub->groups_.push_back(p.group);
  }
  return sub;
}

MeshPtr DeviceMesh::bridge_to(const DeviceMesh& other) const {
  if (other.world_ != world_)
    throw DTensorError(str() + " and " + other.str() + " belong to different worlds; tensors cannot move between them");
  if (other.device_type_ != device_type_)
    throw DTensorError(str() + " is a " + c10::DeviceTypeName(device_type_) + " mesh and " + other.str() + " a " +
                       c10::DeviceTypeName(other.device_type_) +
                       " one; move the tensor between meshes of one device type, then to the device");
  std::set<int64_t> members(ranks_.begin(), ranks_.end());
  members.insert(other.ranks_.begin(), other.ranks_.end());
  const std::vector<int64_t> ranks(members.begin(), members.end());
  const auto cached = [&ranks](const DeviceMesh& mesh) -> MeshPtr {
    std::lock_guard<std::mutex> lock(mesh.bridges_mutex_);
    const auto it = mesh.bridges_.find(ranks);
    return it == mesh.bridges_.end() ? nullptr : it->second;
  };
  MeshPtr bridge = cached(*this);
  if (!bridge) bridge = cached(other);
  if (!bridge) bridge = create(world_, {static_cast<int64_t>(ranks.size())}, ranks, MeshOptions{{}, device_type_, timeout_, backend_});
  for (const DeviceMesh* mesh : {this, &other}) {
    std::lock_guard<std::mutex> lock(mesh->bridges_mutex_);
    mesh->bridges_[ranks] = bridge;
  }
  return bridge;
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  return this == &other || (shape_ == other.shape_ && ranks_ == other.ranks_ && dim_names_ == other.dim_names_ &&
                            device_type_ == other.device_type_);
}

std::string DeviceMesh::str() const {
  size_t pos = 0;
  std::string s = "DeviceMesh(" + nested(shape_, ranks_, 0, pos);
  if (!dim_names_.empty()) {
    s += ", names=(";
    for (size_t i = 0; i < dim_names_.size(); ++i) s += (i ? ", " : "") + dim_names_[i];
    s += ")";
  }
  return s + ")";
}

bool same_mesh(const MeshPtr& a, const MeshPtr& b) { return a == b || (a && b && *a == *b); }

}  // namespace dtensor
