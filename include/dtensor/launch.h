#pragma once
// Starting the ranks of a job. A program calls run_local_ranks from main(): run as a plain program it
// starts N copies of itself as local ranks and waits for them; each copy (or a process started by
// torchrun --no-python or mpirun) runs the body with its World. The copies are started through mpirun
// when dtensor has MPI (so CPU meshes use the MPI backend), else forked directly (Gloo).

#include <chrono>
#include <functional>
#include <memory>

#include "dtensor/world.h"

namespace dtensor {

enum class LaunchVia {
  // DTENSOR_LAUNCHER (fork or mpirun) when set; else mpirun when dtensor has MPI, unless
  // DTENSOR_BACKEND=gloo asks for Gloo; else fork.
  Automatic,
  Fork,    // fork+exec each rank; the launcher holds the store and names the rank that failed
  Mpirun,  // one mpirun starts the ranks (the MPI backend needs its runtime); mpirun names a failed rank
};

struct LaunchOptions {
  int nprocs = 4;
  // After one rank fails, how long the others get to notice (their collectives time out) and exit
  // before they are killed.
  std::chrono::seconds grace{30};
  // Kill the whole job after this long; 0 means no limit.
  std::chrono::seconds timeout{0};
  LaunchVia via = LaunchVia::Automatic;
};

// If this process is a rank, runs body(world) and returns its result (an exception becomes exit code
// 1 with the message on stderr; under MPI it then ends the job, whose other ranks may be waiting for
// this one). Otherwise starts `options.nprocs` copies of this program with the
// same arguments and returns 0 when all exit with 0, else the first failure's code.
int run_local_ranks(int argc, char** argv, const LaunchOptions& options,
                    const std::function<int(const std::shared_ptr<World>&)>& body);

// True when the environment says this process is one rank of a job (dtensor, torchrun or mpirun).
bool started_as_rank();

}  // namespace dtensor
