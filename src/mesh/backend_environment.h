#pragma once
// The registered communication backends as the mesh layer reads them: DTENSOR_BACKEND, read in one
// place (the world resolves Automatic with it, and the launcher forks rather than going through
// mpirun when it asks for Gloo), and the whole list.

#include <optional>
#include <vector>

#include "dtensor/comm_backend.h"

namespace dtensor::detail {

// The CPU backend DTENSOR_BACKEND names, nothing when it is unset; throws DTensorError otherwise.
std::optional<CommBackend> backend_from_environment();

// Every registered backend, by name.
std::vector<CommBackendDescription> comm_backends();

}  // namespace dtensor::detail
