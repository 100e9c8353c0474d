#include "mpi_work.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include "mpi_runtime.h"
#include "mpi_types.h"

namespace dtensor::detail::mpi {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

}  // namespace

std::string seconds_text(milliseconds t) { return std::to_string(t.count() / 1000.0).substr(0, 6) + " s"; }

Communicator::~Communicator() {
  auto lock = call_lock();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || stuck) return;
  for (MPI_Comm* c : {&comm, &schedules})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

Work::Work(std::shared_ptr<Communicator> comm, const char* operation, std::vector<at::Tensor> keep_alive,
           std::vector<at::Tensor> outputs, std::vector<Stage> stages)
    : comm_(std::move(comm)),
      operation_(operation),
      keep_alive_(std::move(keep_alive)),
      outputs_(std::move(outputs)),
      stages_(std::move(stages)) {}

void Work::begin() {
  if (stages_.empty()) {
    done_ = true;
    return;
  }
  auto lock = call_lock();
  post_next();
}

void Work::post_next() {
  const int rc = stages_[posted_++].post(comm_->comm, requests_);
  if (rc != MPI_SUCCESS) {
    comm_->stuck = true;
    mark_unfinishable();
    throw std::runtime_error(std::string("MPI ") + operation_ + " failed to start: " + error_text(rc));
  }
}

bool Work::poll() {
  while (!done_) {
    int flag = 0, rc = MPI_SUCCESS;
    {
      auto lock = call_lock();
      rc = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE);
    }
    if (rc != MPI_SUCCESS) {
      comm_->stuck = true;
      mark_unfinishable();
      throw std::runtime_error(std::string("MPI ") + operation_ + " failed: " + error_text(rc));
    }
    if (!flag) return false;
    requests_.clear();
    if (const auto& after = stages_[posted_ - 1].after) after();
    if (posted_ == stages_.size()) {
      done_ = true;
      keep_alive_.clear();
      stages_.clear();
    } else {
      auto lock = call_lock();
      post_next();
    }
  }
  return true;
}

// A spinning rank would take the core from the peer it waits for, so it yields when ranks outnumber
// cores (and after a while in any case).
bool Work::wait(milliseconds timeout) {
  const milliseconds limit = timeout == kNoTimeout ? comm_->timeout : timeout;
  const auto start = steady_clock::now();
  const bool yield = oversubscribed();
  for (int polls = 1; !poll(); ++polls) {
    if (yield || polls > 1000) std::this_thread::yield();
    if ((polls & 63) == 0 && steady_clock::now() - start > limit) {
      comm_->stuck = true;
      // MPI may still complete it (a late peer) and write into its buffers: they live until exit.
      abandon([self = c10::intrusive_ptr<Work>::reclaim_copy(this)] { return self->poll(); });
      throw std::runtime_error(std::string("MPI ") + operation_ + " did not complete within " + seconds_text(limit) +
                               "; the group's communicator is unusable from now on");
    }
  }
  return true;
}

bool AllOf::isCompleted() {
  return std::all_of(works_.begin(), works_.end(), [](const auto& w) { return w->isCompleted(); });
}

bool AllOf::isSuccess() const {
  return std::all_of(works_.begin(), works_.end(), [](const auto& w) { return w->isSuccess(); });
}

bool AllOf::wait(milliseconds timeout) {
  for (auto& w : works_) w->wait(timeout);
  return true;
}

std::vector<at::Tensor> AllOf::result() {
  std::vector<at::Tensor> out;
  for (auto& w : works_)
    for (auto& t : w->result()) out.push_back(t);
  return out;
}

}  // namespace dtensor::detail::mpi
