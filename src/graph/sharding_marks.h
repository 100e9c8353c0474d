#pragma once
// Marking a graph with placements (strategy_problem.h: the strategies enumerated, then solved), then
// partitioning: reshards inserted where a strategy needs an input elsewhere, local arguments and
// kernels applied, values given their local shapes. Shared by the tensor-parallel transform and SPMD
// expansion.

#include <optional>
#include <vector>

#include "dtensor/graph/program.h"
#include "strategy_problem.h"

namespace dtensor::graph::detail {

// The moves, local arguments and kernels of the solved problem's choices, per node.
Marks write_moves(StrategyProblem& problem);

// Inserts the reshards the marks call for (one per value and target, shared by its consumers),
// applies local arguments and kernels (or a graph form of a kernel, where one exists), gives every
// value its local meta and every size argument its value on this rank, and brings each graph output
// to its target in `output_targets` (one per graph output; nullopt: Partial entries become Replicate,
// shards stay; an empty vector: every output Replicate). Each collective's note says why it is there
// and what it costs by the planner's model (in program.annotations, with the bytes it moves).
void partition(Program& program, const MeshPtr& mesh, Marks& marks,
               const std::vector<std::optional<Placements>>& output_targets = {});

}  // namespace dtensor::graph::detail
