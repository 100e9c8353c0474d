// The checks one rank's list can fail on its own: the order of what it needs from itself, and SENDs
// without RECVs (or the reverse) between two ranks' lists.

#include <map>
#include <tuple>

#include "dtensor/errors.h"
#include "schedule_checks.h"
#include "schedule_rules.h"

namespace dtensor::pipeline::detail {
namespace {

[[noreturn]] void refuse_at(int rank, size_t step, const Action& action, const std::string& why) {
  throw DTensorError("pipeline schedule: " + where(rank, step, action) + " " + why);
}

// Why a compute's input is not there yet, or "" when it is. A compute-only schedule brings inputs
// from other ranks implicitly, so only a producer on the same rank is checked there.
std::string missing_input(const Schedule& schedule, const Action& action, const ActionSet& done) {
  const std::optional<int> producer = producer_stage(action, schedule.num_stages);
  if (!producer || input_arrived(schedule, action, done)) return "";
  const bool remote = schedule.rank_of(*producer) != schedule.rank_of(action.stage);
  if (remote && !schedule.has_communication()) return "";
  const std::string needed = action.kind == ActionKind::Forward ? "the output of " : "the input gradient of ";
  const std::string from = needed + "stage " + std::to_string(*producer) + " for this microbatch";
  if (!remote) return "runs before " + from + " (computed on this rank)";
  const ActionKind recv = action.kind == ActionKind::Forward ? ActionKind::RecvForward : ActionKind::RecvBackward;
  return "runs before " + to_string(Action{action.stage, recv, action.microbatch}) + " brings " + from +
         " from rank " + std::to_string(schedule.rank_of(*producer));
}

// Why a SEND or RECV has no business here (its peer stage is absent or on this very rank), or "".
std::string misplaced_transfer(const Schedule& schedule, const Action& action) {
  const bool forward = action.kind == ActionKind::SendForward || action.kind == ActionKind::RecvBackward;
  const int peer = forward ? action.stage + 1 : action.stage - 1;
  if (peer < 0 || peer >= schedule.num_stages) return "names stage " + std::to_string(peer) + ", which does not exist";
  if (schedule.rank_of(peer) == schedule.rank_of(action.stage))
    return "moves data to stage " + std::to_string(peer) + " on the same rank, which needs no SEND or RECV";
  return "";
}

// What `action` must come after on its own rank, or "" when it does.
std::string out_of_order(const Schedule& schedule, const Action& action, const ActionSet& done) {
  auto ran = [&](ActionKind kind) { return done.contains({action.stage, kind, action.microbatch}); };
  switch (action.kind) {
    case ActionKind::Forward:
      return missing_input(schedule, action, done);
    case ActionKind::FullBackward:
    case ActionKind::BackwardInput:
      if (!ran(ActionKind::Forward)) return "runs its backward before its forward";
      return missing_input(schedule, action, done);
    case ActionKind::BackwardWeight:
      return ran(ActionKind::BackwardInput) ? "" : "runs W before its I";
    case ActionKind::SendForward:
      if (!ran(ActionKind::Forward)) return "sends before the forward it sends";
      return misplaced_transfer(schedule, action);
    case ActionKind::SendBackward:
      if (!ran(ActionKind::FullBackward) && !ran(ActionKind::BackwardInput))
        return "sends before the backward it sends";
      return misplaced_transfer(schedule, action);
    default:
      return misplaced_transfer(schedule, action);
  }
}

}  // namespace

void check_rank_order(const Schedule& schedule) {
  for (size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    ActionSet done;
    for (size_t step = 0; step < schedule.ranks[rank].size(); ++step) {
      const Slot& slot = schedule.ranks[rank][step];
      if (!slot) continue;
      const std::string why = out_of_order(schedule, *slot, done);
      if (!why.empty()) refuse_at(static_cast<int>(rank), step, *slot, why);
      done.insert(*slot);
    }
  }
}

void check_pairs(const Schedule& schedule) {
  // Where each transfer's SEND and RECV run (rank, step), keyed by its SEND.
  using Places = std::vector<std::pair<int, size_t>>;
  std::map<std::tuple<int, ActionKind, int>, std::pair<Places, Places>> transfers;
  for (size_t rank = 0; rank < schedule.ranks.size(); ++rank)
    for (size_t step = 0; step < schedule.ranks[rank].size(); ++step) {
      const Slot& slot = schedule.ranks[rank][step];
      if (!slot || is_compute(slot->kind)) continue;
      const bool is_send = slot->kind == ActionKind::SendForward || slot->kind == ActionKind::SendBackward;
      const Action send = is_send ? *slot : matching_send(*slot);
      auto& [sends, recvs] = transfers[{send.stage, send.kind, send.microbatch}];
      (is_send ? sends : recvs).emplace_back(static_cast<int>(rank), step);
    }
  for (const auto& [key, places] : transfers) {
    const Action send{std::get<0>(key), std::get<1>(key), std::get<2>(key)};
    const Action recv = matching_recv(send);
    const auto& [sends, recvs] = places;
    for (const auto& [action, mine, peer, theirs] :
         {std::tuple{send, &sends, recv, &recvs}, std::tuple{recv, &recvs, send, &sends}}) {
      if (mine->empty()) continue;
      const auto [rank, step] = mine->front();
      if (mine->size() > 1) refuse_at(rank, step, action, "runs " + std::to_string(mine->size()) + " times, not once");
      if (theirs->empty())
        refuse_at(rank, step, action, "has no " + to_string(peer) + " on rank " +
                                          std::to_string(schedule.rank_of(peer.stage)) + " to pair with");
    }
  }
}

}  // namespace dtensor::pipeline::detail
