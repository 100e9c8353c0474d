#pragma once
// The parts of `validate` (private to src/pipeline).

#include "dtensor/pipeline_schedule.h"

namespace dtensor::pipeline::detail {

// Sizes agree, and every action names a stage and microbatch in range, on the rank holding the stage.
void check_structure(const Schedule& schedule);

// Each (stage, microbatch) runs one forward and one backward (B, or I and W).
void check_counts(const Schedule& schedule);

// On each rank, every action after what it needs from the same rank: a backward after its forward,
// W after I, a compute after its input (its producer, or the RECV bringing it), a SEND after its
// compute; and SENDs and RECVs only between stages on different ranks.
void check_rank_order(const Schedule& schedule);

// Each SEND has exactly one RECV on its peer's rank, and each RECV its SEND.
void check_pairs(const Schedule& schedule);

// Runs the ranks' lists against each other, RECVs blocking, and refuses one that cannot finish.
void check_finishes(const Schedule& lowered, SendCompletion sends);

}  // namespace dtensor::pipeline::detail
