// DeviceMesh's reshaping: flatten and unflatten dims, meshes over groups made elsewhere, and this
// rank's place along a dim.

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <set>

#include "dtensor/device_mesh.h"
#include "dtensor/errors.h"
#include "dtensor/world.h"
#include "mesh_family.h"

namespace dtensor {
namespace {

std::string joined(const std::vector<std::string>& names, const std::string& separator) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : separator) + n;
  return s;
}

}  // namespace

std::shared_ptr<DeviceMesh> DeviceMesh::relative(Shape shape, std::vector<int64_t> ranks, std::vector<std::string> names) const {
  MeshOptions options{std::move(names), device_type_, timeout_, backend_, planning_only_};
  std::shared_ptr<DeviceMesh> mesh(new DeviceMesh(world_, std::move(shape), std::move(ranks), std::move(options)));
  mesh->family_ = family_;
  return mesh;
}

MeshPtr DeviceMesh::flatten(const std::string& name) const {
  if (dim_names_.empty())
    throw DTensorError("DeviceMesh::flatten: " + str() + " has no dim names; name the dims (MeshOptions::dim_names) to flatten them");
  const std::string flat_name = name.empty() ? joined(dim_names_, "_") : name;
  if (ndim() == 1 && dim_names_[0] == flat_name) return shared_from_this();
  if (!coordinate_)
    throw DTensorError("rank " + std::to_string(world_->rank()) + " is not part of " + str() + " and cannot flatten it");
  const auto& root_names = family_->root_dim_names;
  if (std::find(root_names.begin(), root_names.end(), flat_name) != root_names.end())
    throw DTensorError("DeviceMesh::flatten: '" + flat_name + "' is already a dim of the mesh " + str() +
                       " was sliced from (" + joined(root_names, ", ") + "); pass another name");
  std::vector<int64_t> root_dims;
  for (int64_t d = 0; d < ndim(); ++d) {
    if (is_root()) root_dims.push_back(d);
    else root_dims.insert(root_dims.end(), root_dims_[static_cast<size_t>(d)].begin(), root_dims_[static_cast<size_t>(d)].end());
  }
  std::shared_ptr<detail::MeshGroup> group;
  {
    std::lock_guard<std::mutex> lock(family_->mutex);
    const auto known = family_->flattened.find(flat_name);
    if (known != family_->flattened.end() && known->second.root_dims != root_dims)
      throw DTensorError("DeviceMesh::flatten: the name '" + flat_name + "' was given to other dims flattened before; pass another name");
    if (known != family_->flattened.end()) group = known->second.group;
  }
  std::vector<int64_t> dims(static_cast<size_t>(ndim()));
  for (int64_t d = 0; d < ndim(); ++d) dims[static_cast<size_t>(d)] = d;
  if (!group && !planning_only_) group = new_group_along(dims);
  {
    std::lock_guard<std::mutex> lock(family_->mutex);
    family_->flattened.try_emplace(flat_name, detail::MeshFamily::Flattened{root_dims, group});
  }
  std::shared_ptr<DeviceMesh> flat = relative({size()}, ranks_, {flat_name});
  flat->root_dims_.push_back(std::move(root_dims));
  if (!planning_only_) flat->groups_.push_back(std::move(group));
  return flat;
}

MeshPtr DeviceMesh::unflatten(int64_t dim, const Shape& sizes, const std::vector<std::string>& names) const {
  if (dim < 0 || dim >= ndim())
    throw DTensorError("DeviceMesh::unflatten: dim " + std::to_string(dim) + " is out of range for " + str());
  const std::string what = "DeviceMesh::unflatten(" + dim_label(dim) + " of " + str() + ")";
  if (dim_names_.empty()) throw DTensorError(what + ": the mesh has no dim names; name its dims (MeshOptions::dim_names)");
  if (sizes.empty() || sizes.size() != names.size())
    throw DTensorError(what + ": give one name per size (" + std::to_string(sizes.size()) + " sizes, " +
                       std::to_string(names.size()) + " names)");
  for (auto s : sizes)
    if (s <= 0) throw DTensorError(what + ": every size must be positive");
  if (numel(sizes) != shape_[static_cast<size_t>(dim)])
    throw DTensorError(what + ": the sizes multiply to " + std::to_string(numel(sizes)) + ", not the dim's size " +
                       std::to_string(shape_[static_cast<size_t>(dim)]));
  Shape shape = shape_;
  std::vector<std::string> dim_names = dim_names_;
  shape.erase(shape.begin() + dim);
  shape.insert(shape.begin() + dim, sizes.begin(), sizes.end());
  dim_names.erase(dim_names.begin() + dim);
  dim_names.insert(dim_names.begin() + dim, names.begin(), names.end());
  if (std::set<std::string>(dim_names.begin(), dim_names.end()).size() != dim_names.size())
    throw DTensorError(what + ": the dims would be named (" + joined(dim_names, ", ") + "); names must be unique");
  MeshOptions options{dim_names, device_type_, timeout_, backend_, planning_only_};
  std::shared_ptr<DeviceMesh> mesh(new DeviceMesh(world_, std::move(shape), ranks_, std::move(options)));
  if (planning_only_ || !coordinate_) return mesh;
  const auto split = static_cast<int64_t>(sizes.size());
  for (int64_t d = 0; d < mesh->ndim(); ++d) {
    if (d < dim) mesh->groups_.push_back(groups_[static_cast<size_t>(d)]);
    else if (d >= dim + split) mesh->groups_.push_back(groups_[static_cast<size_t>(d - split + 1)]);
    else mesh->groups_.push_back(mesh->new_group_along({d}));
  }
  return mesh;
}

MeshPtr DeviceMesh::from_group(const std::shared_ptr<World>& world, std::vector<c10::intrusive_ptr<c10d::Backend>> groups,
                               const Shape& shape, const std::vector<int64_t>& ranks, MeshOptions options) {
  if (options.planning_only) throw DTensorError("DeviceMesh::from_group: a mesh over process groups cannot be planning-only");
  std::shared_ptr<DeviceMesh> mesh = laid_out(world, shape, ranks, std::move(options), "DeviceMesh::from_group");
  const std::string what = "DeviceMesh::from_group(" + mesh->str() + ")";
  if (groups.size() != shape.size())
    throw DTensorError(what + ": " + std::to_string(groups.size()) + " process groups for " + std::to_string(shape.size()) +
                       " mesh dims; pass one group per dim");
  if (!mesh->coordinate_)
    throw DTensorError(what + ": rank " + std::to_string(world->rank()) + " is not in the mesh, yet it was handed groups");
  const std::string backend(to_string(mesh->backend_));
  for (int64_t d = 0; d < mesh->ndim(); ++d) {
    const auto& group = groups[static_cast<size_t>(d)];
    const std::string at = what + ": the group for " + mesh->dim_label(d);
    if (!group) throw DTensorError(at + " is null");
    const int64_t expected_rank = (*mesh->coordinate_)[static_cast<size_t>(d)];
    if (group->getSize() != shape[static_cast<size_t>(d)] || group->getRank() != expected_rank)
      throw DTensorError(at + " has " + std::to_string(group->getSize()) + " ranks with this one at " +
                         std::to_string(group->getRank()) + ", but the mesh puts " + std::to_string(shape[static_cast<size_t>(d)]) +
                         " ranks along it with this one at " + std::to_string(expected_rank) +
                         "; pass the ranks as the groups order them");
    if (group->getBackendName() != backend)
      throw DTensorError(at + " is a " + group->getBackendName() + " group, but the mesh's backend is " + backend +
                         "; set MeshOptions::backend to the groups' backend");
    mesh->groups_.push_back(std::make_shared<detail::MeshGroup>(group, /*borrowed=*/true));
  }
  return mesh;
}

MeshPtr DeviceMesh::from_group(const std::shared_ptr<World>& world, c10::intrusive_ptr<c10d::Backend> group,
                               const std::vector<int64_t>& ranks, MeshOptions options) {
  return from_group(world, {std::move(group)}, {static_cast<int64_t>(ranks.size())}, ranks, std::move(options));
}

int64_t DeviceMesh::local_rank(int64_t dim) const {
  if (!coordinate_)
    throw DTensorError("DeviceMesh::local_rank: rank " + std::to_string(world_->rank()) + " is not part of " + str());
  if (dim < 0 || dim >= ndim())
    throw DTensorError("DeviceMesh::local_rank: dim " + std::to_string(dim) + " is out of range for " + str());
  return (*coordinate_)[static_cast<size_t>(dim)];
}

int64_t DeviceMesh::local_rank() const {
  if (ndim() != 1)
    throw DTensorError("DeviceMesh::local_rank: " + str() + " has " + std::to_string(ndim()) + " dims; name the dim");
  return local_rank(0);
}

}  // namespace dtensor
