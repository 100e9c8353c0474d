#include "dtensor/comm_backend.h"

#include <cstdlib>

#include "backend_environment.h"
#include "dtensor/errors.h"

namespace dtensor {

std::string to_string(CommBackend backend) {
  switch (backend) {
    case CommBackend::Automatic: return "automatic";
    case CommBackend::Gloo: return "gloo";
    case CommBackend::Mpi: return "mpi";
    case CommBackend::Nccl: return "nccl";
  }
  return "?";
}

bool mpi_built_in() {
#ifdef DTENSOR_WITH_MPI
  return true;
#else
  return false;
#endif
}

namespace detail {

std::optional<CommBackend> backend_from_environment() {
  const char* value = std::getenv("DTENSOR_BACKEND");
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string name = value;
  if (name == "gloo") return CommBackend::Gloo;
  if (name == "mpi") return CommBackend::Mpi;
  throw DTensorError("DTENSOR_BACKEND='" + name + "' is not a backend for CPU meshes; use gloo or mpi");
}

}  // namespace detail

}  // namespace dtensor
