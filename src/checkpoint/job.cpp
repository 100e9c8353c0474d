#include "job.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <functional>

#include "dtensor/api.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "dtensor/world.h"

namespace dtensor::checkpoint::detail {

Job Job::of(const State& state, const std::shared_ptr<World>& given, const char* what) {
  Job job;
  job.world = given;
  for (const auto& [name, tensor] : state) {
    if (!tensor.defined()) throw DTensorError(std::string("checkpoint::") + what + ": tensor '" + name + "' is undefined");
    if (!is_dtensor(tensor)) continue;
    const auto& world = mesh_of(tensor)->world();
    if (job.world && job.world != world)
      throw DTensorError(std::string("checkpoint::") + what + ": tensor '" + name +
                         "' lives on another world than the rest of the state; save each world's state separately");
    job.world = world;
  }
  if (job.world) {
    job.rank = job.world->rank();
    job.size = job.world->size();
  }
  return job;
}

namespace {

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown exception";
  }
}

}  // namespace

void Job::agree(const std::exception_ptr& mine, const std::string& step) const {
  if (!world) {
    if (mine) std::rethrow_exception(mine);
    return;
  }
  // Every rank agrees as often as the others, so this count names the same agreement everywhere.
  static std::atomic<int64_t> agreements{0};
  const std::string key = "dtensor/checkpoint/agreement/" + std::to_string(agreements++) + "/";
  if (mine) {
    const std::string what = message_of(mine);
    world->store()->set(key + std::to_string(rank), std::vector<uint8_t>(what.begin(), what.end()));
  }
  // One bit per failed rank (ranks past 61 share the top bit).
  int64_t failed = 0;
  try {
    failed = world->sum_across_ranks(mine ? int64_t{1} << std::min(rank, 62) : 0);
  } catch (const DTensorError& e) {  // a rank died or hangs: say in which step
    throw DTensorError("checkpoint: " + step + ": the ranks could not agree (" + e.what() + ")");
  }
  if (mine) std::rethrow_exception(mine);
  if (failed == 0) return;
  int first = 0;
  while (!(failed & (int64_t{1} << first))) ++first;
  const auto bytes = world->store()->get(key + std::to_string(first));
  throw DTensorError("checkpoint: " + step + " failed on rank " + std::to_string(first) + " (rank " +
                     std::to_string(rank) + " stops too): " + std::string(bytes.begin(), bytes.end()));
}

void Job::check_same(const std::string& fingerprint, const char* what) const {
  if (!world) return;
  const int64_t mine = static_cast<int64_t>(std::hash<std::string>{}(fingerprint) & 0x3fffffff);
  const int64_t total = world->sum_across_ranks(mine);
  if (total != mine * size)
    throw DTensorError(std::string("checkpoint::") + what + ": rank " + std::to_string(rank) +
                       "'s state differs from another rank's (names, shapes, dtypes or placements); every rank must " +
                       what + " the same state");
}

}  // namespace dtensor::checkpoint::detail
