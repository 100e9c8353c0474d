// Several stages per rank in loop placement (rank r holds r, r + p, r + 2p, ...): Looped BFS and
// Interleaved 1F1B, slot for slot as PyTorch 2.15 builds them. Their bubbles are PyTorch's own
// estimates, not a timing model; the goldens compare them as text.

#include "dtensor/pipeline_schedule.h"
#include "schedule_builder.h"

namespace dtensor::pipeline {

using detail::add_bubbles;

Schedule looped_bfs(int num_ranks, int stages_per_rank, int num_microbatches) {
  Schedule schedule = detail::empty_schedule("LoopedBFS", num_ranks,
                                             loop_placement(num_ranks, num_ranks * stages_per_rank),
                                             num_microbatches);
  for (int rank = 0; rank < num_ranks; ++rank) {
    std::vector<Slot>& slots = schedule.ranks[static_cast<size_t>(rank)];
    slots.resize(static_cast<size_t>(rank));
    for (int local = 0; local < stages_per_rank; ++local)
      for (int mb = 0; mb < num_microbatches; ++mb)
        slots.emplace_back(Action{local * num_ranks + rank, ActionKind::Forward, mb});
    add_bubbles(slots, 2 * (num_ranks - 1 - rank));  // the first backward's trip back up
    for (int local = stages_per_rank - 1; local >= 0; --local)
      for (int mb = num_microbatches - 1; mb >= 0; --mb)
        slots.emplace_back(Action{local * num_ranks + rank, ActionKind::FullBackward, mb});
  }
  return schedule;
}

Schedule interleaved_1f1b(int num_ranks, int stages_per_rank, int num_microbatches) {
  const auto shape = detail::Interleaving::of("Interleaved1F1B", num_ranks, stages_per_rank, num_microbatches);
  Schedule schedule = shape.empty_schedule("Interleaved1F1B");
  for (int rank = 0; rank < num_ranks; ++rank) {
    const std::vector<Action> forwards = shape.forwards(rank);
    const std::vector<Action> backwards = shape.backwards(rank, ActionKind::FullBackward);
    const int warmup = shape.warmup(rank, 2);
    std::vector<Slot>& slots = schedule.ranks[static_cast<size_t>(rank)];
    slots.resize(static_cast<size_t>(rank));
    slots.insert(slots.end(), forwards.begin(), forwards.begin() + warmup);
    // PyTorch waits here until the step it estimates the first backward comes back at.
    if (warmup > 0) add_bubbles(slots, stages_per_rank * num_ranks + 2 * (num_ranks - 1 - rank) - (warmup + rank));
    for (int k = 0; k < shape.ops(); ++k) {
      // Steady phase: a forward, then a backward. Cooldown: a step's wait in place of the forward.
      if (warmup + k < shape.ops()) slots.emplace_back(forwards[static_cast<size_t>(warmup + k)]);
      else slots.emplace_back(std::nullopt);
      slots.emplace_back(backwards[static_cast<size_t>(k)]);
    }
  }
  return schedule;
}

}  // namespace dtensor::pipeline
