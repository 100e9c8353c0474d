#pragma once
// DTENSOR_BACKEND, read in one place: the world resolves Automatic with it, and the launcher forks
// rather than going through mpirun when it asks for Gloo.

#include <optional>

#include "dtensor/comm_backend.h"

namespace dtensor::detail {

// Gloo or Mpi when DTENSOR_BACKEND names one, nothing when it is unset; throws DTensorError otherwise.
std::optional<CommBackend> backend_from_environment();

}  // namespace dtensor::detail
