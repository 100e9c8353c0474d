// validate: the structural checks, then the order on each rank, then the ranks against each other.

#include <map>
#include <tuple>

#include "dtensor/errors.h"
#include "dtensor/pipeline_schedule.h"
#include "schedule_checks.h"
#include "schedule_rules.h"

namespace dtensor::pipeline {
namespace detail {
namespace {

[[noreturn]] void refuse(const std::string& what) { throw DTensorError("pipeline schedule: " + what); }

// Calls `visit(rank, step, action)` for every action, in each rank's order.
template <typename Visit>
void for_each_action(const Schedule& schedule, Visit visit) {
  for (size_t rank = 0; rank < schedule.ranks.size(); ++rank)
    for (size_t step = 0; step < schedule.ranks[rank].size(); ++step)
      if (const Slot& slot = schedule.ranks[rank][step]) visit(static_cast<int>(rank), step, *slot);
}

std::string stage_microbatch(int stage, int microbatch) {
  return "stage " + std::to_string(stage) + ", microbatch " + std::to_string(microbatch);
}

}  // namespace

void check_structure(const Schedule& schedule) {
  if (schedule.num_ranks < 1 || static_cast<int>(schedule.ranks.size()) != schedule.num_ranks)
    refuse("has " + std::to_string(schedule.ranks.size()) + " ranks' lists for " +
           std::to_string(schedule.num_ranks) + " ranks");
  if (static_cast<int>(schedule.stage_to_rank.size()) != schedule.num_stages || schedule.num_microbatches < 1)
    refuse("needs a rank for each of its " + std::to_string(schedule.num_stages) +
           " stages and at least one microbatch");
  for (int stage = 0; stage < schedule.num_stages; ++stage)
    if (schedule.rank_of(stage) < 0 || schedule.rank_of(stage) >= schedule.num_ranks)
      refuse("stage " + std::to_string(stage) + " is placed on rank " + std::to_string(schedule.rank_of(stage)) +
             ", not one of the " + std::to_string(schedule.num_ranks) + " ranks");
  if (schedule.overlapped.size() > schedule.ranks.size())
    refuse("marks overlapped actions on " + std::to_string(schedule.overlapped.size()) + " ranks of " + std::to_string(schedule.ranks.size()));
  for (size_t rank = 0; rank < schedule.overlapped.size(); ++rank)
    for (const size_t step : schedule.overlapped[rank]) {
      const std::vector<Slot>& slots = schedule.ranks[rank];
      const bool pair = step + 1 < slots.size() && slots[step] && slots[step + 1] && slots[step]->kind == ActionKind::Forward &&
                        slots[step + 1]->kind == ActionKind::FullBackward;
      if (!pair)
        refuse("rank " + std::to_string(rank) + ", step " + std::to_string(step) +
               ": an overlapped action (OVERLAP_F_B) must be a forward (F) and then a full backward (B)");
    }
  for_each_action(schedule, [&](int rank, size_t step, const Action& action) {
    if (action.stage < 0 || action.stage >= schedule.num_stages)
      refuse(where(rank, step, action) + ": there are " + std::to_string(schedule.num_stages) + " stages");
    if (action.microbatch < 0 || action.microbatch >= schedule.num_microbatches)
      refuse(where(rank, step, action) + ": there are " + std::to_string(schedule.num_microbatches) +
             " microbatches");
    if (schedule.rank_of(action.stage) != rank)
      refuse(where(rank, step, action) + ": stage " + std::to_string(action.stage) + " is on rank " +
             std::to_string(schedule.rank_of(action.stage)));
  });
}

void check_counts(const Schedule& schedule) {
  std::map<std::tuple<int, ActionKind, int>, int> runs;
  for_each_action(schedule, [&](int, size_t, const Action& a) { ++runs[{a.stage, a.kind, a.microbatch}]; });
  for (int stage = 0; stage < schedule.num_stages; ++stage) {
    for (int mb = 0; mb < schedule.num_microbatches; ++mb) {
      auto count = [&](ActionKind kind) { return runs[{stage, kind, mb}]; };
      const std::string what = stage_microbatch(stage, mb) + " (rank " + std::to_string(schedule.rank_of(stage)) + ")";
      if (count(ActionKind::Forward) != 1)
        refuse(what + " runs its forward " + std::to_string(count(ActionKind::Forward)) + " times, not once");
      const int full = count(ActionKind::FullBackward);
      const int input = count(ActionKind::BackwardInput);
      const int weight = count(ActionKind::BackwardWeight);
      if (!(full == 1 && input == 0 && weight == 0) && !(full == 0 && input == 1 && weight == 1))
        refuse(what + " runs B " + std::to_string(full) + ", I " + std::to_string(input) + " and W " +
               std::to_string(weight) + " times; its backward must run once, as B or as I then W");
    }
  }
}

}  // namespace detail

void validate(const Schedule& schedule, SendCompletion sends) {
  detail::check_structure(schedule);
  detail::check_counts(schedule);
  if (schedule.has_communication()) {
    // Pairs first: a RECV left out is better named as its SEND's missing partner than as the compute
    // after it running without its input.
    detail::check_pairs(schedule);
    detail::check_rank_order(schedule);
    detail::check_finishes(schedule, sends);
    return;
  }
  detail::check_rank_order(schedule);
  const Schedule lowered = with_communication(schedule);
  detail::check_pairs(lowered);
  detail::check_rank_order(lowered);
  detail::check_finishes(lowered, sends);
}

}  // namespace dtensor::pipeline
