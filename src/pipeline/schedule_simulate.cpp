// Whether the ranks' lists finish when run against each other: each rank runs its list in order, a
// RECV blocks until its SEND has been posted (Buffered) or until the peer stands at that SEND
// (Rendezvous, where the SEND blocks too). When no rank can move and some are not at their end, the
// schedule hangs: those ranks are named with the action each is stuck at and what it waits for.
// (Computes never block here: check_rank_order has already put their inputs before them.)

#include "dtensor/errors.h"
#include "schedule_checks.h"
#include "schedule_rules.h"

namespace dtensor::pipeline::detail {
namespace {

bool is_send(const Action& action) {
  return action.kind == ActionKind::SendForward || action.kind == ActionKind::SendBackward;
}

struct Simulation {
  const Schedule& schedule;
  SendCompletion sends;
  std::vector<size_t> next;  // [rank] -> the step it stands at
  ActionSet posted;          // SENDs run so far

  // The step of the next action `rank` runs, past any bubbles.
  size_t position(size_t rank) const {
    const std::vector<Slot>& slots = schedule.ranks[rank];
    size_t step = next[rank];
    while (step < slots.size() && !slots[step]) ++step;
    return step;
  }
  const Action* at(size_t rank) const {
    const size_t step = position(rank);
    return step < schedule.ranks[rank].size() ? &*schedule.ranks[rank][step] : nullptr;
  }

  // Moves `rank` past its current action if it can; returns whether it did.
  bool step(size_t rank) {
    const Action* action = at(rank);
    if (action == nullptr) return false;
    if (is_send(*action)) {
      if (sends == SendCompletion::Rendezvous) return false;  // its RECV moves it
      posted.insert(*action);
    } else if (is_communication(action->kind) && !receive(*action)) {
      return false;
    }
    next[rank] = position(rank) + 1;
    return true;
  }

  // Whether `recv` can complete now; a rendezvous completes its SEND with it.
  bool receive(const Action& recv) {
    const Action send = matching_send(recv);
    if (sends == SendCompletion::Buffered) return posted.contains(send);
    const size_t peer = static_cast<size_t>(schedule.rank_of(send.stage));
    const Action* peer_at = at(peer);
    if (peer_at == nullptr || *peer_at != send) return false;
    next[peer] = position(peer) + 1;
    return true;
  }

  std::string stuck_ranks() const {
    std::string stuck;
    for (size_t rank = 0; rank < next.size(); ++rank) {
      const Action* action = at(rank);
      if (action == nullptr) continue;
      const Action peer = is_send(*action) ? matching_recv(*action) : matching_send(*action);
      stuck += "\n  " + where(static_cast<int>(rank), position(rank), *action) + " waits for " + to_string(peer) +
               " on rank " + std::to_string(schedule.rank_of(peer.stage));
    }
    return stuck;
  }
};

}  // namespace

void check_finishes(const Schedule& lowered, SendCompletion sends) {
  Simulation run{lowered, sends, std::vector<size_t>(lowered.ranks.size(), 0), {}};
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t rank = 0; rank < lowered.ranks.size(); ++rank)
      while (run.step(rank)) moved = true;
  }
  const std::string stuck = run.stuck_ranks();
  if (!stuck.empty())
    throw DTensorError("pipeline schedule cannot finish: these ranks wait on each other forever:" + stuck +
                       "\nschedule:\n" + format_pipeline_order(lowered));
}

}  // namespace dtensor::pipeline::detail
