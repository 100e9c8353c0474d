#pragma once
// The work of one collective on the MPI backend: a schedule of stages, each a set of non-blocking MPI
// calls and what to do once they complete (reduce a received block, copy out). wait() polls until the
// last stage is done, yielding the core when ranks outnumber cores, and fails after the time limit
// instead of hanging.

#include <ATen/core/Tensor.h>
#include <mpi.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mpi_shared_memory.h"

namespace dtensor::detail::mpi {

// One group's communicator, shared by its backend and the work in flight on it.
struct Communicator {
  MPI_Comm comm = MPI_COMM_NULL;
  // A duplicate for dtensor's own point-to-point schedules (the ring reductions), so their messages
  // never meet the user's send/recv.
  MPI_Comm schedules = MPI_COMM_NULL;
  // Collectives started on the group so far: the same on every member, so it tags a schedule's
  // messages alike everywhere and keeps those of different collectives in flight apart.
  uint64_t started = 0;
  int rank = 0;
  int size = 0;
  std::chrono::milliseconds timeout{0};
  // A collective on it never completed: MPI cannot retire the request, so the communicator is unusable.
  std::atomic<bool> stuck{false};
  // Where its all-gathers and small all-reduces go when every member is on this host (else null: MPI's).
  std::unique_ptr<SharedMemory> shared_memory;
  // Whether its all-to-alls go there too (mpi_backend.cpp says when).
  bool all_to_all_shared = false;

  ~Communicator();
};

struct Stage {
  // Starts this stage's MPI calls on `comm` (appending their requests); returns an MPI error code.
  std::function<int(MPI_Comm comm, std::vector<MPI_Request>& requests)> post;
  // Runs once they all completed.
  std::function<void()> after;
};

class Work final : public c10d::Work {
 public:
  // `keep_alive`: the buffers MPI reads or writes until the last stage completes.
  Work(std::shared_ptr<Communicator> comm, const char* operation, std::vector<at::Tensor> keep_alive,
       std::vector<at::Tensor> outputs, std::vector<Stage> stages);

  // Posts the first stage; throws when MPI refuses it. A work without stages (its collective ran
  // outside MPI, before the work was made) is complete at once.
  void begin();

  bool isCompleted() override { return poll(); }
  bool isSuccess() const override { return done_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override;

 private:
  bool poll();
  void post_next();  // the caller holds call_lock()

  std::shared_ptr<Communicator> comm_;
  const char* operation_;
  std::vector<at::Tensor> keep_alive_;
  std::vector<at::Tensor> outputs_;
  std::vector<Stage> stages_;
  size_t posted_ = 0;  // stages posted so far
  std::vector<MPI_Request> requests_;
  bool done_ = false;
};

// "1.5000 s", for messages.
std::string seconds_text(std::chrono::milliseconds t);

// Several works as one: what the coalesced collectives return.
class AllOf final : public c10d::Work {
 public:
  explicit AllOf(std::vector<c10::intrusive_ptr<c10d::Work>> works) : works_(std::move(works)) {}
  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

}  // namespace dtensor::detail::mpi
