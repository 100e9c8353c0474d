#pragma once
// Which communication library carries a mesh's collectives, and how a backend joins dtensor: one
// registration (register_comm_backend) from its own file. Gloo, MPI and NCCL are registered that way.

#include <c10/core/DeviceType.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace at {
class Tensor;
}
namespace c10d {
class Backend;
class Store;
class Work;
struct ReduceOp;
}  // namespace c10d

namespace dtensor {

class World;

// A backend, by the name it was registered under (what DTENSOR_BACKEND takes).
class CommBackend {
 public:
  constexpr explicit CommBackend(std::string_view name) : name_(name) {}

  // The environment's choice: DTENSOR_BACKEND when set (a backend for the mesh's device); else, of the
  // backends registered for the device, the one that prefers this world (MPI for a job started by
  // mpirun), else the device's default (Gloo for CPU meshes, NCCL for CUDA ones).
  static const CommBackend Automatic;
  static const CommBackend Gloo;  // TCP, any launcher; CPU tensors
  static const CommBackend Mpi;   // Open MPI (shared memory on one host); CPU tensors; the job must run under mpirun
  static const CommBackend Nccl;  // CUDA tensors

  std::string_view name() const { return name_; }
  bool operator==(const CommBackend& o) const { return name_ == o.name_; }
  bool operator<(const CommBackend& o) const { return name_ < o.name_; }

 private:
  std::string_view name_;  // the registered name (static storage)
};

inline constexpr CommBackend CommBackend::Automatic{"automatic"};
inline constexpr CommBackend CommBackend::Gloo{"gloo"};
inline constexpr CommBackend CommBackend::Mpi{"mpi"};
inline constexpr CommBackend CommBackend::Nccl{"nccl"};

// "gloo", "mpi", "nccl", "automatic" or a registered backend's name.
std::string to_string(CommBackend backend);

// Whether this build of dtensor has the MPI backend (CMake found MPI; -DDTENSOR_WITH_MPI=OFF removes it).
bool mpi_built_in();

// What dtensor needs to know of a backend to run meshes on it.
struct CommBackendDescription {
  CommBackend backend;
  c10::DeviceType device;  // the tensors it carries
  // How c10d's ProcessGroup calls it, for the functional collectives of per-rank graph programs
  // (c10d::ProcessGroup::BackendType).
  int c10d_type = 0;
  // The default for `device` when nothing else applies; among the rest, an Automatic mesh takes a
  // backend whose `prefers` says yes for its world (MPI: the world was started by mpirun).
  bool default_for_device = false;
  std::function<bool(const World&)> prefers;
  // Throws DTensorError when `world` cannot host groups of this backend (MPI: not started by mpirun).
  std::function<void(const World&)> check_world;
  // Called for every world made from the environment, before its first group (MPI initialises itself
  // in a job started by mpirun).
  std::function<void(const World&)> on_world_started;
  // One group over the sorted world `ranks` (this process, `world_rank`, among them) that meets
  // through `store`; `rank` is this process's index in `ranks`. Collectives time out after `timeout`.
  struct GroupRequest {
    c10::intrusive_ptr<c10d::Store> store;
    const std::vector<int64_t>& ranks;
    int rank;
    int world_rank;
    std::chrono::milliseconds timeout;
  };
  std::function<c10::intrusive_ptr<c10d::Backend>(const GroupRequest&)> make_group;
  // Optional: the all-reduce of `input` written into `output`, `input` untouched (c10d's is in place,
  // so without it dtensor copies first).
  std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&, at::Tensor& output, const at::Tensor& input,
                                               const c10d::ReduceOp&)>
      all_reduce_into;
  // Whether its list all-to-all (alltoall) takes strided views as they are; else dtensor packs the
  // pieces into one buffer for all_to_all_single.
  bool all_to_all_takes_views = false;
};

// Makes `description.backend` available to meshes (MeshOptions::backend, DTENSOR_BACKEND). Registering
// a name again replaces it. Call before meshes use it (at static initialisation, for a library).
void register_comm_backend(CommBackendDescription description);

// The registered backend `backend`; throws DTensorError naming the registered ones when there is none.
const CommBackendDescription& comm_backend_description(CommBackend backend);

// The names registered for `device`, alphabetically ("gloo or mpi").
std::string comm_backends_for(c10::DeviceType device);

}  // namespace dtensor
