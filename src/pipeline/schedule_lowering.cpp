// Lowering a compute-only schedule for execution (PyTorch's _add_send_recv): the ranks' lists are
// walked together, one action per rank per round, in rank order. A compute runs once its input is on
// its rank; one whose result another rank needs is followed by its SEND, and the RECV is appended to
// the receiving rank's list right then. A rank never places its own RECVs, so each RECV is placed
// after its SEND: with buffered sends the lowered lists always finish (running the actions in the
// order they were placed is one way). A compute-only order that stops the walk cannot finish at all.

#include <algorithm>

#include "dtensor/errors.h"
#include "dtensor/pipeline_schedule.h"
#include "schedule_checks.h"
#include "schedule_rules.h"

namespace dtensor::pipeline {
namespace {

using detail::ActionSet;

// The SEND a compute is followed by when its result goes to another rank.
std::optional<Action> send_after(const Schedule& schedule, const Action& action) {
  int consumer = -1;
  if (action.kind == ActionKind::Forward && action.stage < schedule.num_stages - 1) consumer = action.stage + 1;
  const bool sends_gradient = action.kind == ActionKind::FullBackward || action.kind == ActionKind::BackwardInput;
  if (sends_gradient && action.stage > 0) consumer = action.stage - 1;
  if (consumer < 0 || schedule.rank_of(consumer) == schedule.rank_of(action.stage)) return std::nullopt;
  const ActionKind kind = action.kind == ActionKind::Forward ? ActionKind::SendForward : ActionKind::SendBackward;
  return Action{action.stage, kind, action.microbatch};
}

// Each stuck rank's next action that waits (of an overlapped pair, the one whose input is missing).
[[noreturn]] void refuse_stuck(const Schedule& schedule, const std::vector<size_t>& next, const std::vector<ActionSet>& done) {
  std::string stuck;
  for (size_t rank = 0; rank < next.size(); ++rank) {
    if (next[rank] >= schedule.ranks[rank].size()) continue;
    size_t step = next[rank];
    if (schedule.overlaps_next(rank, step) && detail::input_arrived(schedule, *schedule.ranks[rank][step], done[rank])) ++step;
    const Action& action = *schedule.ranks[rank][step];
    const int producer = *detail::producer_stage(action, schedule.num_stages);
    stuck += "\n  " + detail::where(static_cast<int>(rank), step, action) + " waits for stage " +
             std::to_string(producer) + " on rank " + std::to_string(schedule.rank_of(producer)) +
             " to run microbatch " + std::to_string(action.microbatch) + " first";
  }
  throw DTensorError("pipeline schedule cannot finish: these ranks wait on each other forever:" + stuck +
                     "\nschedule:\n" + format_pipeline_order(schedule));
}

}  // namespace

Schedule with_communication(const Schedule& compute_only) {
  if (compute_only.has_communication())
    throw DTensorError("pipeline schedule: with_communication takes a compute-only schedule; this one "
                       "already has SEND and RECV actions");
  detail::check_structure(compute_only);
  Schedule lowered = compute_only;
  for (std::vector<Slot>& slots : lowered.ranks) slots.clear();
  lowered.overlapped.assign(compute_only.ranks.size(), {});
  std::vector<ActionSet> done(compute_only.ranks.size());
  std::vector<size_t> next(compute_only.ranks.size(), 0);
  auto run = [&](size_t rank, const Action& action) {
    lowered.ranks[rank].emplace_back(action);
    done[rank].insert(action);
  };
  for (bool remaining = true; remaining;) {
    remaining = false;
    bool progress = false;
    for (size_t rank = 0; rank < compute_only.ranks.size(); ++rank) {
      const std::vector<Slot>& slots = compute_only.ranks[rank];
      if (next[rank] >= slots.size()) continue;
      remaining = true;
      // The next action, or an overlapped pair, which runs once both its inputs are there.
      const size_t count = compute_only.overlaps_next(rank, next[rank]) ? 2 : 1;
      const auto first = slots.begin() + static_cast<std::ptrdiff_t>(next[rank]), last = first + static_cast<std::ptrdiff_t>(count);
      if (!std::all_of(first, last, [&](const Slot& slot) { return !slot || detail::input_arrived(compute_only, *slot, done[rank]); })) continue;
      next[rank] += count;
      progress = true;
      if (count == 2) lowered.overlapped[rank].insert(lowered.ranks[rank].size());
      for (auto it = first; it != last; ++it)
        if (*it) run(rank, **it);
      for (auto it = first; it != last; ++it) {
        if (!*it) continue;
        if (const std::optional<Action> send = send_after(compute_only, **it)) {
          run(rank, *send);
          const Action recv = detail::matching_recv(*send);
          run(static_cast<size_t>(compute_only.rank_of(recv.stage)), recv);
        }
      }
    }
    if (remaining && !progress) refuse_stuck(compute_only, next, done);
  }
  return lowered;
}

}  // namespace dtensor::pipeline
