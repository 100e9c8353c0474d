#pragma once
// The ranks taking part in a save or load, and how they agree: every step that can fail on one rank
// ends with every rank learning which failed, so all of them stop together (with the failing rank's
// own error there) instead of some waiting forever for the others.

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/checkpoint.h"

namespace dtensor::checkpoint::detail {

struct Job {
  std::shared_ptr<World> world;  // null: one process
  int rank = 0;
  int size = 1;
  // The world's agreement channel (World::sum_across_ranks): an asynchronous save agrees on its own,
  // apart from whatever the job's thread does meanwhile.
  std::string channel;

  // The world of the state's DTensors (all on one world), else `given`, else one process.
  static Job of(const State& state, const std::shared_ptr<World>& given, const char* what);

  // Throws on every rank when `mine` holds an error on any rank: this rank's own, or one naming the
  // ranks that failed at `step`.
  void agree(const std::exception_ptr& mine, const std::string& step) const;
  // Every rank's `mine`, by rank (World::gather_across_ranks on the job's channel).
  std::vector<std::string> gather(const std::string& mine) const;
  // Throws on every rank unless every rank passed the same `fingerprint` (of its state's names,
  // shapes, dtypes and placements).
  void check_same(const std::string& fingerprint, const char* what) const;
};

// Refuses a partitioned save or load (each rank its own tensors) made without the job's world, where a
// rank holding only plain tensors would take itself for the only one while the others wait for it, or
// made node-local, whose transfers assume every rank holds the same state.
void check_partitioned(bool partitioned, bool node_local, const std::shared_ptr<World>& world, const char* what);

}  // namespace dtensor::checkpoint::detail
