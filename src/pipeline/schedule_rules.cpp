// The dependencies between actions: which stage's result each compute needs, and how SENDs pair
// with RECVs.

#include "schedule_rules.h"

#include "dtensor/errors.h"

namespace dtensor::pipeline::detail {

std::optional<int> producer_stage(const Action& action, int num_stages) {
  switch (action.kind) {
    case ActionKind::Forward:
      if (action.stage > 0) return action.stage - 1;
      return std::nullopt;
    case ActionKind::FullBackward:
    case ActionKind::BackwardInput:
      if (action.stage < num_stages - 1) return action.stage + 1;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

Action produced_by(const Action& action, int producer, ActionKind backward_kind) {
  const ActionKind kind = action.kind == ActionKind::Forward ? ActionKind::Forward : backward_kind;
  return {producer, kind, action.microbatch};
}

bool input_arrived(const Schedule& schedule, const Action& action, const ActionSet& done_here) {
  const std::optional<int> producer = producer_stage(action, schedule.num_stages);
  if (!producer) return true;
  if (schedule.rank_of(*producer) != schedule.rank_of(action.stage)) {
    const ActionKind recv = action.kind == ActionKind::Forward ? ActionKind::RecvForward : ActionKind::RecvBackward;
    return done_here.contains({action.stage, recv, action.microbatch});
  }
  return done_here.contains(produced_by(action, *producer, ActionKind::BackwardInput)) ||
         done_here.contains(produced_by(action, *producer, ActionKind::FullBackward));
}

Action matching_recv(const Action& send) {
  if (send.kind == ActionKind::SendForward) return {send.stage + 1, ActionKind::RecvForward, send.microbatch};
  if (send.kind == ActionKind::SendBackward) return {send.stage - 1, ActionKind::RecvBackward, send.microbatch};
  throw DTensorError("pipeline schedule: " + to_string(send) + " is not a SEND");
}

Action matching_send(const Action& recv) {
  if (recv.kind == ActionKind::RecvForward) return {recv.stage - 1, ActionKind::SendForward, recv.microbatch};
  if (recv.kind == ActionKind::RecvBackward) return {recv.stage + 1, ActionKind::SendBackward, recv.microbatch};
  throw DTensorError("pipeline schedule: " + to_string(recv) + " is not a RECV");
}

std::string where(int rank, size_t step, const Action& action) {
  return "rank " + std::to_string(rank) + ", step " + std::to_string(step) + " (" + to_string(action) +
         ": stage " + std::to_string(action.stage) + ", microbatch " + std::to_string(action.microbatch) + ")";
}

}  // namespace dtensor::pipeline::detail
