// The Schedule itself: where stages live, and its forms.

#include <algorithm>

#include "dtensor/errors.h"
#include "dtensor/pipeline_schedule.h"

namespace dtensor::pipeline {
namespace {

void check_sizes(int num_ranks, int num_stages) {
  if (num_ranks < 1 || num_stages < 1 || num_stages % num_ranks != 0)
    throw DTensorError("pipeline schedule: " + std::to_string(num_stages) +
                       " stages cannot be placed evenly on " + std::to_string(num_ranks) + " ranks");
}

}  // namespace

bool Schedule::has_communication() const {
  return std::ranges::any_of(ranks, [](const std::vector<Slot>& slots) {
    return std::ranges::any_of(slots, [](const Slot& slot) { return slot && is_communication(slot->kind); });
  });
}

std::vector<int> loop_placement(int num_ranks, int num_stages) {
  check_sizes(num_ranks, num_stages);
  std::vector<int> stage_to_rank;
  for (int stage = 0; stage < num_stages; ++stage) stage_to_rank.push_back(stage % num_ranks);
  return stage_to_rank;
}

std::vector<int> v_placement(int num_ranks, int num_stages) {
  check_sizes(num_ranks, num_stages);
  std::vector<int> stage_to_rank;
  for (int stage = 0; stage < num_stages; ++stage) {
    const int position = stage % num_ranks;
    const bool going_down = (stage / num_ranks) % 2 == 0;
    stage_to_rank.push_back(going_down ? position : num_ranks - 1 - position);
  }
  return stage_to_rank;
}

Schedule without_bubbles(const Schedule& schedule) {
  Schedule dense = schedule;
  for (size_t rank = 0; rank < dense.ranks.size(); ++rank) {
    std::vector<Slot> kept;
    std::set<size_t> overlapped;
    for (size_t i = 0; i < schedule.ranks[rank].size(); ++i) {
      if (!schedule.ranks[rank][i]) continue;
      if (schedule.overlaps_next(rank, i)) overlapped.insert(kept.size());
      kept.push_back(schedule.ranks[rank][i]);
    }
    dense.ranks[rank] = std::move(kept);
    if (rank < dense.overlapped.size()) dense.overlapped[rank] = std::move(overlapped);
  }
  return dense;
}

}  // namespace dtensor::pipeline
