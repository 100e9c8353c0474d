#include "dtensor/comm_backend.h"

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

}  // namespace dtensor
