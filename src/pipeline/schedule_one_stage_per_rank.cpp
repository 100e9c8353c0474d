// GPipe and 1F1B: one stage per rank, stage r on rank r. Each action is placed at the step it can run
// at when every action takes one step and a result reaches the next rank by the next step: a forward
// one step after the previous stage's, a backward one step after the next stage's. The bubbles are
// what that timing leaves, so the bubble fraction of 1F1B is the theory's (p - 1) / (m + p - 1).

#include <algorithm>

#include "dtensor/pipeline_schedule.h"
#include "schedule_builder.h"

namespace dtensor::pipeline {

using detail::place_at;

Schedule gpipe(int num_ranks, int num_microbatches) {
  Schedule schedule = detail::empty_schedule("GPipe", num_ranks, loop_placement(num_ranks, num_ranks),
                                             num_microbatches);
  const int last_forward_done = num_ranks - 1 + num_microbatches;  // the last stage's first free step
  for (int rank = 0; rank < num_ranks; ++rank) {
    std::vector<Slot>& slots = schedule.ranks[static_cast<size_t>(rank)];
    const int first_backward = last_forward_done + (num_ranks - 1 - rank);
    for (int mb = 0; mb < num_microbatches; ++mb) {
      place_at(slots, static_cast<size_t>(rank + mb), {rank, ActionKind::Forward, mb});
      place_at(slots, static_cast<size_t>(first_backward + mb), {rank, ActionKind::FullBackward, mb});
    }
  }
  return schedule;
}

// Rank r warms up with min(p - 1 - r, m) forwards at steps r, r + 1, ...; the last stage runs its
// microbatch k forward at step p - 1 + 2k and backward at p + 2k, and each rank above runs backward k
// one step after the rank below it. In the steady phase each further forward goes right before a
// backward, in the step that backward's timing leaves free.
Schedule one_f_one_b(int num_ranks, int num_microbatches) {
  Schedule schedule = detail::empty_schedule("1F1B", num_ranks, loop_placement(num_ranks, num_ranks),
                                             num_microbatches);
  for (int rank = 0; rank < num_ranks; ++rank) {
    std::vector<Slot>& slots = schedule.ranks[static_cast<size_t>(rank)];
    const int warmup = std::min(num_ranks - 1 - rank, num_microbatches);
    const int first_backward = 2 * num_ranks - 1 - rank;
    for (int mb = 0; mb < num_microbatches; ++mb) {
      const int forward_step = mb < warmup ? rank + mb : first_backward - 1 + 2 * (mb - warmup);
      place_at(slots, static_cast<size_t>(forward_step), {rank, ActionKind::Forward, mb});
      place_at(slots, static_cast<size_t>(first_backward + 2 * mb), {rank, ActionKind::FullBackward, mb});
    }
  }
  return schedule;
}

}  // namespace dtensor::pipeline
