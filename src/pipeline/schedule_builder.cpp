// What the schedule builders share.

#include "schedule_builder.h"

#include <algorithm>

#include "dtensor/errors.h"

namespace dtensor::pipeline::detail {
namespace {

// Numbers each stage's actions 0, 1, 2, ... in the order given.
std::vector<Action> numbered(const std::vector<int>& stages, int num_stages, ActionKind kind) {
  std::vector<int> next_microbatch(static_cast<size_t>(num_stages), 0);
  std::vector<Action> actions;
  for (int stage : stages) actions.push_back({stage, kind, next_microbatch[static_cast<size_t>(stage)]++});
  return actions;
}

}  // namespace

Schedule empty_schedule(const char* name, int num_ranks, const std::vector<int>& stage_to_rank,
                        int num_microbatches) {
  if (num_microbatches < 1)
    throw DTensorError(std::string("pipeline schedule ") + name + ": needs at least one microbatch, got " +
                       std::to_string(num_microbatches));
  Schedule schedule;
  schedule.num_ranks = num_ranks;
  schedule.num_stages = static_cast<int>(stage_to_rank.size());
  schedule.num_microbatches = num_microbatches;
  schedule.stage_to_rank = stage_to_rank;
  schedule.ranks.resize(static_cast<size_t>(num_ranks));
  return schedule;
}

void place_at(std::vector<Slot>& slots, size_t step, const Action& action) {
  if (slots.size() <= step) slots.resize(step + 1);
  slots[step] = action;
}

void add_bubbles(std::vector<Slot>& slots, int count) {
  if (count > 0) slots.insert(slots.end(), static_cast<size_t>(count), std::nullopt);
}

Interleaving Interleaving::of(const char* name, int num_ranks, int local_stages, int num_microbatches) {
  if (num_ranks < 1 || local_stages < 1 || num_microbatches < 1)
    throw DTensorError(std::string("pipeline schedule ") + name +
                       ": ranks, stages per rank and microbatches must be positive");
  const int rounds = std::max(1, num_microbatches / num_ranks);
  if (num_microbatches % rounds != 0)
    throw DTensorError(std::string("pipeline schedule ") + name + ": " + std::to_string(num_microbatches) +
                       " microbatches are not a multiple of the number of rounds, " + std::to_string(rounds) +
                       " (max(1, microbatches / ranks)), as PyTorch requires");
  return {num_ranks, local_stages, num_microbatches, num_microbatches / rounds};
}

int Interleaving::warmup(int rank, int per_hop) const {
  return std::min((local_stages - 1) * per_round + per_hop * (num_ranks - 1 - rank), ops());
}

std::vector<Action> Interleaving::forwards(int rank) const {
  std::vector<int> stages;
  for (int k = 0; k < ops(); ++k) stages.push_back(((k / per_round) % local_stages) * num_ranks + rank);
  return numbered(stages, local_stages * num_ranks, ActionKind::Forward);
}

std::vector<Action> Interleaving::backwards(int rank, ActionKind kind) const {
  std::vector<int> stages;
  for (int k = 0; k < ops(); ++k)
    stages.push_back((local_stages - 1 - (k / per_round) % local_stages) * num_ranks + rank);
  return numbered(stages, local_stages * num_ranks, kind);
}

Schedule Interleaving::empty_schedule(const char* name) const {
  return detail::empty_schedule(name, num_ranks, loop_placement(num_ranks, num_ranks * local_stages),
                                num_microbatches);
}

}  // namespace dtensor::pipeline::detail
