#include "dead_code.h"

namespace dtensor::graph::detail {

void erase_if_unused(Graph& graph, Value* v) {
  Node* n = v ? v->producer() : nullptr;
  if (!n || !n->op) return;
  for (Value* out : n->outputs)
    if (!out->uses().empty()) return;  // the graph's outputs among them
  const auto inputs = n->inputs();
  graph.erase(n);
  for (Value* in : inputs) erase_if_unused(graph, in);
}

}  // namespace dtensor::graph::detail
