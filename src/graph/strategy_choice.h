#pragma once
// Choosing every node's strategy for the whole graph. Eager dispatch must decide op by op, greedily
// (the cheapest strategy for the inputs as they are). A graph is known ahead of time, so after the
// greedy pass the choice is improved for the graph as a whole: one node at a time, the strategy
// that lowers the total cost of the graph (the bytes every reshard moves, by the planner's model,
// a reshard shared by all consumers of a value that need the same target counted once) replaces
// the current one, until no single change helps. Greedy reduce-scatters a Partial activation (cheaper
// than an all-reduce) and then all-gathers it for the next matmul; the whole-graph view sees that one
// all-reduce costs less than both.

#include <map>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "dtensor/graph/ir.h"
#include "dtensor/op_schema.h"

namespace dtensor::graph::detail {

// One node's strategies as the choice sees them.
struct NodeOptions {
  Node* node = nullptr;
  std::vector<Value*> inputs;   // per strategy input: the graph value read (nullptr: a number, never moved)
  std::vector<Value*> outputs;  // the node's tensor outputs, in the strategies' output order
  std::vector<OutputSharding> options;
  size_t chosen = 0;
  bool fixed = false;  // kept as the greedy pass chose (in-place writes depend on their input's placement)
};

class StrategyChoice {
 public:
  explicit StrategyChoice(MeshPtr mesh) : mesh_(std::move(mesh)) {}

  // The cheapest option for the inputs' current placements, as eager propagation picks: one that
  // moves nothing wins; otherwise the least moved. Sets the outputs' placements.
  void choose_greedily(NodeOptions& n);

  // Improves the choices of the whole graph (`nodes` in graph order); `needed_replicate` are values
  // that must end Replicate (the graph's outputs). Returns the total cost before and after.
  std::pair<double, double> improve(std::vector<NodeOptions>& nodes, const std::vector<Value*>& needed_replicate);

  // What moving `v` from `from` to `to` costs (0 when equal).
  double move_cost(const Value* v, const Placements& from, const Placements& to);
  // Whether that move needs a collective (a chunk or a partition of local data does not).
  bool communicates(const Value* v, const Placements& from, const Placements& to) const;

 private:
  MeshPtr mesh_;
  std::map<std::tuple<const Value*, std::string, std::string>, double> costs_;
};

}  // namespace dtensor::graph::detail
