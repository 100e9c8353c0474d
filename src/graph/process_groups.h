#pragma once
// The process groups a per-rank program's functional collectives name (_c10d_functional ops find
// their group by name in c10d's registry): one per mesh dim, registered while a program holds it.

#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <string>

#include "dtensor/device_mesh.h"

namespace c10d {
class ProcessGroup;
}

namespace dtensor::graph::detail {

class RegisteredGroup {
 public:
  RegisteredGroup(const DeviceMesh& mesh, int64_t dim, std::string name);
  ~RegisteredGroup();
  RegisteredGroup(const RegisteredGroup&) = delete;
  RegisteredGroup& operator=(const RegisteredGroup&) = delete;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;  // c10d's registry holds it weakly
};

// The name of `mesh`'s group along `dim`, "dtensor_mesh<shape>_<digest>_<dim name or dim<d>>" (as
// "dtensor_mesh2x2_1f3a9c07_tp"), the digest taken over the mesh's shape, ranks, the dim and the
// backend: derived from what the group is, not from how many meshes a process made before, so that a
// compiled per-rank program's collectives find their group in any process that builds the same mesh.
// Two meshes alike in all four share the registration (their groups join the same ranks on the same
// backend); a dim name alone never does (an "ep" dim may be either dim of two meshes of one shape).
std::string group_name(const DeviceMesh& mesh, int64_t dim);
// The registration of that group under that name (shared while anyone holds it).
std::shared_ptr<RegisteredGroup> group_for(const DeviceMesh& mesh, int64_t dim);

}  // namespace dtensor::graph::detail
