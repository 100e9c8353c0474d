#pragma once
// Bucketing the all-reduces at the end of a per-rank program. Bringing graph outputs to their
// placements ends a training step with one all-reduce per gradient (every gradient of a data-parallel
// step, the small ones of norms and biases under tensor parallelism), each paying a collective's
// latency: those of one process group and reduce op are coalesced into one (flattened, concatenated,
// all-reduced once, cut back), as DDP's gradient buckets do.

#include "dtensor/graph/program.h"

namespace dtensor::graph::detail {

// Returns how many all-reduces were folded into buckets.
int coalesce_output_all_reduces(Program& program);

}  // namespace dtensor::graph::detail
