#pragma once
// Graph forms of dtensor's local kernels: where a strategy needs more than the op on local shards
// (a vocabulary-sharded embedding masks the indices it does not hold), the per-rank program spells
// that computation out in ATen ops and _c10d_functional collectives, as the op's sharding rule writes it
// (OpRule::graph_form, against GraphFormBuilder), so that it runs, saves and compiles like any other
// graph. A kernel without a graph form stays on its node (the interpreter runs it; such a program
// cannot be saved).

#include <utility>
#include <vector>

#include "dtensor/graph/program.h"

namespace dtensor::graph::detail {

// What replaced each output of a node written out by its graph form (the old value is gone).
using Replacements = std::vector<std::pair<const Value*, Value*>>;

// Replaces `node` (whose arguments are already local) by the ops `form` writes before it, each
// described as part of the node's computation, and returns what replaced its outputs.
Replacements write_graph_form(Program& program, const MeshPtr& mesh, Node* node, const GraphForm& form);

}  // namespace dtensor::graph::detail
