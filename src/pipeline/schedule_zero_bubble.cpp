// Interleaved Zero Bubble (ZB-H1 on several stages per rank, PyTorch's ScheduleInterleavedZeroBubble):
// interleaved 1F1B with each backward split into I (input gradients, which the previous stage waits
// for) and W (weight gradients, which nothing waits for). Rank r runs each W r backwards after its I,
// so the Ws fill the steps where the rank would otherwise wait for a gradient from below.

#include <algorithm>
#include <set>
#include <tuple>

#include "dtensor/pipeline_schedule.h"
#include "schedule_builder.h"

namespace dtensor::pipeline {
namespace {

std::vector<Slot> zero_bubble_rank(const detail::Interleaving& shape, int rank) {
  const std::vector<Action> forwards = shape.forwards(rank);
  const std::vector<Action> inputs = shape.backwards(rank, ActionKind::BackwardInput);
  const int warmup = shape.warmup(rank, 1);
  std::vector<Slot> slots(static_cast<size_t>(rank));
  slots.insert(slots.end(), forwards.begin(), forwards.begin() + warmup);
  if (warmup > 0) detail::add_bubbles(slots, shape.num_ranks - 1 - rank);
  auto weight_of = [&](int k) {
    const Action& input = inputs[static_cast<size_t>(k)];
    return Action{input.stage, ActionKind::BackwardWeight, input.microbatch};
  };
  for (int k = 0; k < shape.ops(); ++k) {
    if (warmup + k < shape.ops()) slots.emplace_back(forwards[static_cast<size_t>(warmup + k)]);
    slots.emplace_back(inputs[static_cast<size_t>(k)]);
    if (k >= rank) slots.emplace_back(weight_of(k - rank));
  }
  for (int k = std::max(0, shape.ops() - rank); k < shape.ops(); ++k) slots.emplace_back(weight_of(k));
  return slots;
}

using Done = std::set<std::tuple<int, ActionKind, int>>;

// Whether the data `action` needs was made in an earlier step (unit-time actions; the result of one
// step reaches any rank by the next).
bool inputs_ready(const Action& action, int num_stages, const Done& done) {
  auto ran = [&](int stage, ActionKind kind) { return done.contains({stage, kind, action.microbatch}); };
  switch (action.kind) {
    case ActionKind::Forward:
      return action.stage == 0 || ran(action.stage - 1, ActionKind::Forward);
    case ActionKind::BackwardInput:
    case ActionKind::FullBackward:
      if (action.stage == num_stages - 1) return ran(action.stage, ActionKind::Forward);
      return ran(action.stage + 1, ActionKind::BackwardInput) || ran(action.stage + 1, ActionKind::FullBackward);
    default:
      return true;  // W needs its own I, which runs earlier on the same rank
  }
}

// PyTorch's _add_bubbles_to_actions: steps all ranks together, and where a rank's next action needs
// data not made in an earlier step, it waits a step. PyTorch checks a backward against the next
// stage's full backward (B) only, so an I never waits for the next stage's I; this checks for either.
// At the goldens' sizes ((4, 4, 8) and (8, 4, 8)) no I has to wait, so both give the same order.
std::vector<std::vector<Slot>> wait_for_inputs(const std::vector<std::vector<Slot>>& ranks, int num_stages) {
  std::vector<std::vector<Slot>> waited(ranks.size());
  std::vector<size_t> next(ranks.size(), 0);
  Done done;
  for (bool busy = true; busy;) {
    busy = false;
    Done done_this_step;
    for (size_t rank = 0; rank < ranks.size(); ++rank) {
      if (next[rank] >= ranks[rank].size()) continue;
      busy = true;
      const Slot& slot = ranks[rank][next[rank]];
      const bool runs = !slot || inputs_ready(*slot, num_stages, done);
      waited[rank].push_back(runs ? slot : std::nullopt);
      if (!runs) continue;
      if (slot) done_this_step.insert({slot->stage, slot->kind, slot->microbatch});
      ++next[rank];
    }
    done.merge(done_this_step);
  }
  return waited;
}

}  // namespace

Schedule interleaved_zero_bubble(int num_ranks, int stages_per_rank, int num_microbatches) {
  const auto shape =
      detail::Interleaving::of("InterleavedZeroBubble", num_ranks, stages_per_rank, num_microbatches);
  Schedule schedule = shape.empty_schedule("InterleavedZeroBubble");
  for (int rank = 0; rank < num_ranks; ++rank)
    schedule.ranks[static_cast<size_t>(rank)] = zero_bubble_rank(shape, rank);
  schedule.ranks = wait_for_inputs(schedule.ranks, schedule.num_stages);
  return schedule;
}

}  // namespace dtensor::pipeline
