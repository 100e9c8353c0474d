#include "job.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdlib>
#include <functional>
#include <random>

#include "dtensor/api.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "dtensor/world.h"

namespace dtensor::checkpoint::detail {
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

// How many processes the launcher started, from the variables dtensor's launcher, torchrun and mpirun set.
int launched_ranks() {
  for (const char* name : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return 1;
}

}  // namespace

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
  } else if (launched_ranks() > 1) {
    // Every process would act as the only one (and write the same files at once).
    throw DTensorError(std::string("checkpoint::") + what + ": the state holds no DTensor and no world was given, but " +
                       std::to_string(launched_ranks()) + " ranks were launched; pass the job's world (options.world)");
  }
  return job;
}

void check_partitioned(bool partitioned, bool node_local, const std::shared_ptr<World>& world, const char* what) {
  if (!partitioned) return;
  if (node_local)
    throw DTensorError(std::string("checkpoint::") + what + ": a partitioned " + what + " cannot be node-local yet; use a directory every rank sees");
  if (!world && launched_ranks() > 1)
    throw DTensorError(std::string("checkpoint::") + what + ": a partitioned " + what + " needs the job's world (options.world) on every rank");
}

void Job::agree(const std::exception_ptr& mine, const std::string& step) const {
  if (!world) {
    if (mine) std::rethrow_exception(mine);
    return;
  }
  std::string failure;  // what the ranks that did not fail throw
  try {
    if (world->sum_across_ranks(mine ? 1 : 0, channel) == 0) return;
    // Some rank failed. Rank 0 draws a key every rank learns; the failing ranks publish their errors
    // under it, and after one more round every other rank reads the first of them.
    const int64_t nonce =
        world->sum_across_ranks(rank == 0 ? static_cast<int64_t>(std::random_device{}() & 0x3fffffff) : 0, channel);
    const std::string prefix = "dtensor/checkpoint/failure/" + std::to_string(nonce) + "/";
    if (mine) {
      const std::string what = message_of(mine);
      world->store(channel)->set(prefix + std::to_string(rank), std::vector<uint8_t>(what.begin(), what.end()));
    }
    world->sum_across_ranks(0, channel);
    failure = "checkpoint: " + step + " failed on another rank (rank " + std::to_string(rank) + " stops too)";
    for (int r = 0; r < size && !mine; ++r) {
      const std::string key = prefix + std::to_string(r);
      if (!world->store(channel)->check({key})) continue;
      const auto bytes = world->store(channel)->get(key);
      failure = "checkpoint: " + step + " failed on rank " + std::to_string(r) + " (rank " + std::to_string(rank) +
                " stops too): " + std::string(bytes.begin(), bytes.end());
      break;
    }
  } catch (const c10::Error& e) {  // the store itself failed
    failure = "checkpoint: " + step + ": the ranks could not agree (" + e.what_without_backtrace() + ")";
  } catch (const DTensorError& e) {  // a rank died or hangs (sum_across_ranks says which)
    failure = "checkpoint: " + step + ": the ranks could not agree (" + e.what() + ")";
  }
  if (mine) std::rethrow_exception(mine);
  throw DTensorError(failure);
}

std::vector<std::string> Job::gather(const std::string& mine) const {
  return world ? world->gather_across_ranks(mine, channel) : std::vector<std::string>{mine};
}

void Job::check_same(const std::string& fingerprint, const char* what) const {
  if (!world) return;
  // Equal hashes everywhere exactly when both the sum and the sum of squares are size times this rank's.
  const int64_t h = static_cast<int64_t>(std::hash<std::string>{}(fingerprint) & 0xfffff);
  const int64_t sum = world->sum_across_ranks(h, channel);
  const int64_t squares = world->sum_across_ranks(h * h, channel);
  if (sum != h * size || squares != h * h * size)
    throw DTensorError(std::string("checkpoint::") + what + ": rank " + std::to_string(rank) +
                       "'s state differs from another rank's (names, shapes, dtypes or placements); every rank must " +
                       what + " the same state");
}

}  // namespace dtensor::checkpoint::detail
