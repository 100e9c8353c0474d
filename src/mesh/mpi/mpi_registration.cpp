// MPI as a dtensor backend: CPU tensors, for jobs that mpirun started (their world is MPI_COMM_WORLD's);
// there it is what an Automatic CPU mesh takes.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "dtensor/comm_backend.h"
#include "dtensor/errors.h"
#include "dtensor/world.h"
#include "mpi_backend.h"
#include "mpi_runtime.h"

namespace dtensor {
namespace {

void require_mpirun(const World& world) {
  if (!world.started_by_mpirun())
    throw DTensorError("rank " + std::to_string(world.rank()) + ": the MPI backend needs a world started by mpirun (" +
                       world.launcher() + " started this one): run the job under mpirun, or through dtensor's launcher "
                       "with DTENSOR_LAUNCHER=mpirun, or use Gloo (DTENSOR_BACKEND=gloo)");
}

[[maybe_unused]] const bool kRegistered = (register_comm_backend({
    .backend = CommBackend::Mpi,
    .device = c10::DeviceType::CPU,
    .c10d_type = static_cast<int>(c10d::ProcessGroup::BackendType::MPI),
    .prefers = [](const World& world) { return world.started_by_mpirun(); },
    .check_world = require_mpirun,
    .on_world_started = [](const World& world) {
      if (world.started_by_mpirun()) detail::mpi::ensure_initialized(world.rank(), world.size());
    },
    .make_group = [](const CommBackendDescription::GroupRequest& request) {
      return detail::make_mpi_backend(request.store, request.ranks, request.world_rank, request.timeout);
    },
    .all_reduce_into = detail::mpi_all_reduce_into,
    .all_to_all_takes_views = true,
}), true);

}  // namespace
}  // namespace dtensor
