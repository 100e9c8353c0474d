#pragma once
// What the schedule builders share (private to src/pipeline).

#include "dtensor/pipeline_schedule.h"

namespace dtensor::pipeline::detail {

// An empty compute-only schedule of `num_ranks` ranks with the stages placed as given. Refuses
// (DTensorError) sizes no schedule can have, naming the schedule.
Schedule empty_schedule(const char* name, int num_ranks, const std::vector<int>& stage_to_rank,
                        int num_microbatches);

// Puts `action` at `step` of `slots`, growing it with bubbles as needed.
void place_at(std::vector<Slot>& slots, size_t step, const Action& action);

void add_bubbles(std::vector<Slot>& slots, int count);

// The shape of PyTorch's interleaved schedules (loop placement, several stages per rank). They go
// through the microbatches in rounds of `per_round` microbatches: a rank runs one round through its
// first local stage, the same round through its next local stage, and so on, then the next round
// (depth first). Backwards go through the local stages in reverse.
struct Interleaving {
  int num_ranks;
  int local_stages;
  int num_microbatches;
  int per_round;

  // Refuses (DTensorError) microbatches that are not a multiple of the rounds, as PyTorch does.
  static Interleaving of(const char* name, int num_ranks, int local_stages, int num_microbatches);

  int ops() const { return local_stages * num_microbatches; }  // forwards (or backwards) per rank
  // Forwards before the first backward: the last rank runs every round but its last local stage's
  // ahead; each rank above it `per_hop` more, to cover the trip down and back.
  int warmup(int rank, int per_hop) const;
  // A rank's forwards (backwards) in its order, each with its stage's next microbatch.
  std::vector<Action> forwards(int rank) const;
  std::vector<Action> backwards(int rank, ActionKind kind) const;
  Schedule empty_schedule(const char* name) const;
};

}  // namespace dtensor::pipeline::detail
