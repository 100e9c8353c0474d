#pragma once
// The process's MPI library: initialized once (by the world of a job that mpirun started), finalized
// at exit. Only this file and mpi_backend.cpp include <mpi.h>, so the rest of dtensor builds the same
// with or without MPI.

#include <functional>
#include <mutex>
#include <string>

namespace dtensor::detail::mpi {

// Initializes MPI (thread level SERIALIZED: every call holds call_lock()) unless done already, and
// checks that MPI's world is dtensor's (`rank` of `size`). Registers MPI_Finalize to run at exit.
// Throws DTensorError when MPI is not built in or the job was not started by mpirun.
void ensure_initialized(int rank, int size);
bool initialized();

// Every MPI call of the process holds this lock (MPI_THREAD_SERIALIZED).
std::unique_lock<std::mutex> call_lock();

// An MPI error leaves requests MPI cannot retire; MPI_Finalize would then wait forever, so the process
// exits without it (mpirun reports the rank and ends the job).
void mark_unfinishable();

// A collective that timed out may still complete (a late peer), and MPI then writes into its buffers:
// `completed` polls it and holds those buffers, until exit. MPI_Finalize runs at exit only if every
// abandoned collective has completed by then.
void abandon(std::function<bool()> completed);

// Ends every rank of the job now (MPI_Abort), after this rank printed why. Under mpirun a failed rank
// must not wait in MPI_Finalize for peers that are themselves waiting for it.
[[noreturn]] void abort_job(int exit_code);

// Whether this process should yield the core while it waits: more local ranks than cores.
bool oversubscribed();

}  // namespace dtensor::detail::mpi
