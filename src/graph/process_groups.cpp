#include "process_groups.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/version.h>

#include <cstdio>
#include <map>
#include <mutex>

#include "dtensor/world.h"

namespace dtensor::graph::detail {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::weak_ptr<RegisteredGroup>>& live_groups() {
  static std::map<std::string, std::weak_ptr<RegisteredGroup>> groups;
  return groups;
}

}  // namespace

RegisteredGroup::RegisteredGroup(const DeviceMesh& mesh, int64_t dim, std::string name) : name_(std::move(name)) {
  auto backend = mesh.group(dim);
  // A ProcessGroup front for the mesh's backend: the functional collectives talk to ProcessGroups.
  group_ = c10::make_intrusive<c10d::ProcessGroup>(mesh.world()->store(), backend->getRank(), backend->getSize());
  auto& group = group_;
  using Type = c10d::ProcessGroup::BackendType;
  const auto type = static_cast<Type>(mesh.backend_description().c10d_type);
  group->setBackend(mesh.device_type(), type, backend);
  group->setDefaultBackend(type);
  group->setGroupName(name_);
  c10d::register_process_group(name_, group);
}

RegisteredGroup::~RegisteredGroup() {
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 15
  // Older LibTorch (2.11 on the GPU machines) cannot ask; this group registered the name itself.
  c10d::unregister_process_group(name_);
#else
  if (c10d::is_process_group_registered(name_)) c10d::unregister_process_group(name_);
#endif
}

std::string group_name(const DeviceMesh& mesh, int64_t dim) {
  // FNV-1a over the mesh's shape, ranks, the dim and the backend: what the group is, the same in every
  // process.
  uint64_t hash = 14695981039346656037ULL;
  auto mix = [&](uint64_t word) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (word >> (8 * byte)) & 0xff;
      hash *= 1099511628211ULL;
    }
  };
  std::string shape;
  for (int64_t size : mesh.shape()) {
    mix(static_cast<uint64_t>(size));
    shape += (shape.empty() ? "" : "x") + std::to_string(size);
  }
  for (int64_t rank : mesh.ranks()) mix(static_cast<uint64_t>(rank));
  // The dim too: its groups' members follow from the shape, ranks and dim, while its name need not
  // tell them apart ("ep" is dim 1 of a (dp, ep) mesh and dim 0 of an (ep, tp) mesh of the same ranks).
  mix(static_cast<uint64_t>(dim));
  if (!mesh.planning_only())
    for (char c : mesh.backend_description().backend.name()) mix(static_cast<unsigned char>(c));
  char digest[9];
  std::snprintf(digest, sizeof digest, "%08x", static_cast<uint32_t>(hash ^ (hash >> 32)));
  return "dtensor_mesh" + shape + "_" + digest + "_" +
         (mesh.dim_names().empty() ? "dim" + std::to_string(dim) : mesh.dim_names()[static_cast<size_t>(dim)]);
}

std::shared_ptr<RegisteredGroup> group_for(const DeviceMesh& mesh, int64_t dim) {
  const std::string name = group_name(mesh, dim);
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& slot = live_groups()[name];
  if (auto alive = slot.lock()) return alive;
  auto group = std::make_shared<RegisteredGroup>(mesh, dim, name);
  slot = group;
  return group;
}

}  // namespace dtensor::graph::detail
