#pragma once
// Choosing every node's strategy for the whole graph. Eager dispatch must decide op by op, greedily
// (the cheapest strategy for the inputs as they are). A graph is known ahead of time, so its choice
// can minimise the total cost of the graph: the bytes every reshard moves, by the planner's model, a
// reshard shared by all consumers of a value that need the same target counted once, plus what local
// kernels communicate. Greedy reduce-scatters a Partial activation (cheaper than an all-reduce) and
// then all-gathers it for the next matmul; the whole-graph view sees that one all-reduce costs less.
//  - improve(): local search from the greedy choice (local_search.h): single and compound changes
//    while the total drops.
//  - search_exactly(): dynamic programming over the graph in order. What is still to pay after node
//    i depends only on the placements of the values live across i and which reshards of them are
//    already paid for, so the best completion is computed once per such state; branch and bound
//    (the current choice's cost bounds every branch) keeps the states explored few. It either finds
//    a cheaper choice or proves the current one the cheapest. A joint graph keeps its activations
//    live for the backward, so the states can multiply: past a budget it gives up and the current
//    choice stays.

#include <map>
#include <set>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <string>
#include <vector>

#include "dtensor/graph/ir.h"
#include "dtensor/op_schema.h"

namespace dtensor::graph::detail {

// Ops that only pass their one input on, reshaped or reordered (view, permute, t, expand, clone, ...):
// a weight seen through one is still the weight, and a chain of them moves as a whole.
bool is_view_like(const Node& node);

// Placement lists ordered field by field (the search keys maps on them; their text would be built on
// every lookup).
struct PlacementsLess {
  bool operator()(const Placements& a, const Placements& b) const;
};

// One node's strategies as the choice sees them.
struct NodeOptions {
  Node* node = nullptr;
  std::vector<Value*> inputs;   // per strategy input: the graph value read (nullptr: a number, never moved)
  std::vector<Value*> outputs;  // the node's tensor outputs, in the strategies' output order
  std::vector<OutputSharding> options;
  size_t chosen = 0;
  // Kept as the node-by-node passes chose: in-place writes depend on their input's placement, so the
  // local and exact searches, which change one node at a time, leave writers and the producers of
  // the values they write alone. Each node-by-node pass re-chooses them in graph order, consistently.
  bool fixed = false;
  std::vector<bool> written;  // per input: written in place by this node, so never moved (a copy would take the write)
};

// A graph output and the placements it must end in (nullopt: its own, Partial entries Replicate).
struct NeededOutput {
  Value* value;
  std::optional<Placements> target;
  Placements target_from(const Placements& at) const;
};

class StrategyChoice {
 public:
  // Values' placements are read from and written to `marks`: a choice sets its outputs'.
  StrategyChoice(MeshPtr mesh, Annotations& marks) : mesh_(std::move(mesh)), marks_(marks) {}

  // Where `v` is placed now (it must be marked), and placing it.
  const Placements& at(const Value* v) const { return marks_.placements_of(*v); }
  void place(const Value* v, const Placements& placements) { marks_.set_placements(*v, placements); }

  // How a node-by-node pass picks among options that move inputs.
  enum class Greedy {
    Cheapest,            // the least moved, as eager propagation picks
    PartialToReplicate,  // the least moved among those that reduce Partial inputs to Replicate rather
                         // than reduce-scatter them (Megatron's choice; the cheapest only locally)
    // The same, where a move an earlier node already made of the same value to the same placements
    // counts as none, as partition shares that reshard: RMSNorm's pow all-reduces x, and its multiply
    // then reads the replicated x rather than keeping x Partial, which would leave the attention's
    // keys Partial (Llama's query heads were gathered for it).
    PartialToReplicateOnce,
  };

  // The option for the inputs' current placements: one that moves nothing wins; otherwise as
  // `policy` says. Sets the outputs' placements.
  void choose_greedily(NodeOptions& n, Greedy policy = Greedy::Cheapest);

  // Node-by-node choice of every node again, in order, under `policy`.
  void choose_all_greedily(std::vector<NodeOptions>& nodes, Greedy policy);

  // Improves the choices of the whole graph (`nodes` in graph order); `needed` are values that must
  // end in given placements (the graph's outputs; nullopt: Replicate where Partial). Returns the total
  // cost before and after.
  std::pair<double, double> improve(std::vector<NodeOptions>& nodes, const std::vector<NeededOutput>& needed);

  // The cheapest choice for the whole graph (the current one where none is cheaper), if the search
  // stays within `max_states` states; otherwise nullopt and the choices are left as they were.
  // Returns the total cost.
  std::optional<double> search_exactly(std::vector<NodeOptions>& nodes, const std::vector<NeededOutput>& needed,
                                       size_t max_states = 20000);

  // The total cost of the current choices.
  double total_cost(const std::vector<NodeOptions>& nodes, const std::vector<NeededOutput>& needed);

  // What moving `v` from `from` to `to` costs (0 when equal).
  double move_cost(const Value* v, const Placements& from, const Placements& to);
  // The same for a graph output, whose all-reduces join one bucket at the end (bucketing.h): where
  // the current choice all-reduces more than one output, they pay no latency of their own; one alone
  // (a forward program's logits) pays it.
  double output_move_cost(const Value* v, const Placements& from, const Placements& to);
  // Counts the outputs the current choice all-reduces, for output_move_cost.
  void count_output_reductions(const std::vector<NeededOutput>& needed);
  // Whether that count was more than one: output all-reduces then share a bucket.
  bool shared_bucket() const { return shared_bucket_; }
  // Whether that move needs a collective (a chunk, a partition or a padding of local data does not).
  bool communicates(const Value* v, const Placements& from, const Placements& to) const;
  // Whether it only cuts or partitions the local data: no collective, nothing padded to the whole (a
  // sharded weight stays in place).
  bool moves_in_place(const Value* v, const Placements& from, const Placements& to) const;

 private:
  MeshPtr mesh_;
  Annotations& marks_;
  // Move costs per value (indexed by Value::id), each (from, to) list packed into an integer
  // (pack_placements). A value meets few placement pairs, so scanning its short list beats a hash
  // table over all values, whose lookups missed the cache (a fifth of a 32-layer expansion's time).
  struct CachedMove {
    uint64_t from, to;
    double cost;
  };
  class MoveCache {
   public:
    const double* find(const Value* v, uint64_t from, uint64_t to) const;
    double store(const Value* v, uint64_t from, uint64_t to, double cost);

   private:
    std::vector<std::vector<CachedMove>> by_value_;
  };
  MoveCache costs_, output_costs_;
  bool shared_bucket_ = true;  // see output_move_cost
  // Moves made so far by a PartialToReplicateOnce pass (value, target placements).
  std::set<std::pair<const Value*, std::string>> moves_made_;
};

}  // namespace dtensor::graph::detail
