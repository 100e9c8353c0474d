#pragma once
// Removing what a rewrite left unread.

#include "dtensor/graph/ir.h"

namespace dtensor::graph::detail {

// Erases `v`'s producer, and then its inputs' producers, while nothing reads their outputs (graph
// outputs count as read).
void erase_if_unused(Graph& graph, Value* v);

}  // namespace dtensor::graph::detail
