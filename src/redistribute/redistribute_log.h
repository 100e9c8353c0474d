#pragma once
// DTENSOR_LOG_REDISTRIBUTE=1 logs every redistribution that does something (a non-empty plan) as one
// line on stderr: the rank, the op that caused it (CommContext: "aten::mm", or the API call such as
// "redistribute"), the tensor, the placements, the plan and its bytes. It answers "why did this
// all-gather happen?" without a debugger. For example (one line):
//   dtensor redistribute (rank 0, aten::mm): Float[8, 4] on DeviceMesh([0, 1, 2, 3]), S(0) -> R:
//   all-gather on dim 0 (96 B/rank); 96 B/rank in total
// It also logs each op that runs by composite fallback (dispatch.h), whose constituent ops then log
// their own redistributions.

#include <string>

#include "dtensor/spec.h"

namespace dtensor::detail {

// Logs moving a tensor of spec `from` to placements `to` when logging is on; a flag test otherwise.
void log_redistribute(const DTensorSpec& from, const Placements& to);

// Logs, when logging is on, that `op` has no sharding rule and runs ATen's composite implementation on
// DTensors of `mesh` (the composite fallback).
void log_composite_fallback(const std::string& op, const DeviceMesh& mesh);

// The variable is read once, at the first redistribution; this reads it again (for tests).
void reload_redistribute_log_setting();

}  // namespace dtensor::detail
