#pragma once
// Which communication library carries a mesh's collectives.

#include <string>

namespace dtensor {

enum class CommBackend {
  // The environment's choice: DTENSOR_BACKEND (gloo | mpi) when set; else MPI for CPU meshes of a job
  // started by mpirun (dtensor's launcher uses mpirun when dtensor was built with MPI); else Gloo for
  // CPU meshes and NCCL for CUDA ones.
  Automatic,
  Gloo,  // TCP, any launcher; CPU tensors
  Mpi,   // Open MPI (shared memory on one host); CPU tensors; the job must run under mpirun
  Nccl,  // CUDA tensors
};

// "gloo", "mpi", "nccl" or "automatic".
std::string to_string(CommBackend backend);

// Whether this build of dtensor has the MPI backend (CMake found MPI; -DDTENSOR_WITH_MPI=OFF removes it).
bool mpi_built_in();

}  // namespace dtensor
