#pragma once
// Graph forms of dtensor's local kernels: where a strategy needs more than the op on local shards
// (a vocabulary-sharded embedding masks the indices it does not hold), the per-rank program spells
// that computation out in ATen ops, so that it runs and saves like any other graph. Ops without a
// graph form keep the kernel on the node (the interpreter runs it; such a program cannot be saved).

#include <functional>

#include "dtensor/graph/program.h"

namespace dtensor::graph::detail {

// The global meta of a value whose meta is already local.
using GlobalMeta = std::function<const TensorMeta&(const Value*)>;

// What replaced each output of a lowered node (the old value is gone from the graph).
using Replacements = std::vector<std::pair<const Value*, Value*>>;

// Replaces `node` (whose arguments are already local) by its local computation if a graph form exists
// and returns what replaced its outputs; returns nothing otherwise, leaving the node as it is.
Replacements lower_local_kernel(Program& program, const DeviceMesh& mesh, Node* node, const GlobalMeta& global);

}  // namespace dtensor::graph::detail
