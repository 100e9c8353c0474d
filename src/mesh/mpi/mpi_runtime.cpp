#include "mpi_runtime.h"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "dtensor/errors.h"

namespace dtensor::detail::mpi {
namespace {

std::mutex& the_lock() {
  static std::mutex m;
  return m;
}

std::atomic<bool> g_unfinishable{false};

std::vector<std::function<bool()>>& abandoned() {
  static auto* list = new std::vector<std::function<bool()>>();  // never destroyed: read at exit
  return *list;
}

// Gives late collectives a moment to complete; false if one still has not.
bool abandoned_all_completed() {
  std::vector<std::function<bool()>> pending;
  {
    auto lock = call_lock();
    pending.swap(abandoned());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& completed : pending) {
    while (true) {
      bool done = false;
      try {
        done = completed();
      } catch (const std::exception&) {
        return false;
      }
      if (done) break;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
  }
  return true;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || g_unfinishable || !abandoned_all_completed()) return;
  MPI_Finalize();
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

}  // namespace

std::unique_lock<std::mutex> call_lock() { return std::unique_lock<std::mutex>(the_lock()); }

bool initialized() {
  int done = 0;
  MPI_Initialized(&done);
  return done != 0;
}

void ensure_initialized(int rank, int size) {
  auto lock = call_lock();
  int done = 0;
  MPI_Initialized(&done);
  if (!done) {
    if (!std::getenv("OMPI_COMM_WORLD_RANK"))
      throw DTensorError("rank " + std::to_string(rank) +
                         ": the MPI backend needs a job started by mpirun (or by dtensor's launcher, which uses mpirun "
                         "when dtensor is built with MPI); this process was not, so use Gloo (DTENSOR_BACKEND=gloo)");
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (provided < MPI_THREAD_SERIALIZED)
      throw DTensorError("this MPI library does not allow calls from more than one thread (MPI_THREAD_SERIALIZED), "
                         "which dtensor needs; use Gloo (DTENSOR_BACKEND=gloo)");
    // Errors come back as codes, turned into exceptions naming the operation, instead of aborting.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    std::atexit(finalize_at_exit);
  }
  int mpi_rank = -1, mpi_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  if (mpi_rank != rank || mpi_size != size)
    throw DTensorError("rank " + std::to_string(rank) + " of " + std::to_string(size) + ": MPI's world says rank " +
                       std::to_string(mpi_rank) + " of " + std::to_string(mpi_size) +
                       "; the MPI backend needs the world that mpirun started");
}

void mark_unfinishable() { g_unfinishable = true; }

void abandon(std::function<bool()> completed) {
  auto lock = call_lock();
  abandoned().push_back(std::move(completed));
}

void abort_job(int exit_code) {
  mark_unfinishable();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

bool oversubscribed() {
  static const bool value = [] {
    const int local_ranks = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    const unsigned cores = std::thread::hardware_concurrency();
    return cores == 0 || local_ranks > static_cast<int>(cores);
  }();
  return value;
}

}  // namespace dtensor::detail::mpi
