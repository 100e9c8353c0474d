#pragma once
// The whole-graph choice's local search (StrategyChoice::improve): from a complete choice, changes
// that lower the modelled total cost, until none does.
//  - one node at a time, to its cheapest option;
//  - a node with the views that only pass its output on (one view alone just moves the collective);
//  - the producers of the inputs a node reads through a collective, each switched to an option that
//    makes the input as the node reads it, and so on up (a chain that chunked a replicated value only
//    to gather it again a few nodes later changes only as a whole: each link alone saves nothing);
//  - where nothing drops, changes of about zero cost that resolve a Partial output (they set up the
//    next drop, and cannot cycle).

#include <string>
#include <utility>
#include <optional>
#include <vector>

#include <c10/util/SmallVector.h>

#include "strategy_choice.h"

namespace dtensor::graph::detail {

class LocalSearch {
 public:
  LocalSearch(StrategyChoice& costs, std::vector<NodeOptions>& nodes, const std::vector<NeededOutput>& needed);

  // Runs the search; returns the total cost before and after.
  std::pair<double, double> run();

 private:
  // The placements the consumers of one value need it in, and how many consumers need each: a few
  // entries, searched in place (this is read for every option of every node in every sweep).
  using Needs = c10::SmallVector<std::pair<Placements, int>, 2>;
  // Choices made by a compound change, to undo it: (node, its previous option), in order.
  using Undo = std::vector<std::pair<NodeOptions*, size_t>>;

  static void add_need(Needs& needs, const Placements& to, int count);
  // Changes to a value's needs that a switch would make: (target, +1 or -1), targets owned by options.
  using NeedChanges = c10::SmallVector<std::pair<const Placements*, int>, 4>;
  // What the reshards of `v`, placed `at`, cost for the consumers' needs `of` (with `changes` applied)
  // and the graph outputs it is (one reshard per target). Nothing is copied: this runs for every
  // option of every node in every sweep.
  double value_cost(const Value* v, const Placements& at, const Needs& of, const NeedChanges& changes = {});
  // The needs of `v` (an empty set where nothing reads it).
  const Needs& needs_of(const Value* v) const;
  double total();
  // The change in total cost if `n` switched to option `o`.
  double delta_of(const NodeOptions& n, size_t o);
  void apply(NodeOptions& n, size_t o);
  void revert(Undo& undo);
  // Whether a reshard touches `n`: it takes an input moved, or a consumer (or the graph's output)
  // needs one of its outputs elsewhere. Only then can a compound change around it help.
  bool reshards_around(const NodeOptions& n);
  // Switches `n` to `o` and drags its followers (views) to the options that take their input as it
  // now is; returns the change in total cost.
  double switch_with_followers(NodeOptions& n, size_t o, Undo& undo);
  // Switches `n` to `o` and, up to `depth` producers up, each producer of an input `n` would move
  // with a collective to its cheapest option that makes the input as `n` reads it; returns the change
  // in total cost.
  double switch_with_producers(NodeOptions& n, size_t o, Undo& undo, int depth);
  // The compound changes around `n` (its views dragged, its producers pulled): keeps the first that
  // lowers the total, its switches left in `kept`.
  bool improve_compound(NodeOptions& n, Undo& kept);

  // Which nodes a sweep must look at again. A switch's cost reads the placements and needs of the
  // values its node reads and makes; a change moves the placements of its node's outputs and the
  // needs of its inputs, so it can only open a switch to the nodes one step away (producers and
  // readers of its inputs, readers of its outputs). Compound changes reach kProducerDepth producers
  // up and chains of views down, so for them a change marks its neighbourhood kCompoundReach steps
  // out. Nodes not marked since they last found nothing would find nothing again: a sweep skips them.
  void mark_around(const NodeOptions& changed);
  void mark_all();
  // A compound change around `n`, whose switches mark their neighbourhoods; whether it made one.
  bool compound_at(NodeOptions& n);
  // The best single switch of `n`: a strict improvement, or on a plateau a free one resolving a Partial.
  std::optional<size_t> best_switch(NodeOptions& n, bool plateau);
  // One sweep over the nodes (every node on a plateau, the marked ones otherwise); whether it changed any.
  bool sweep(bool plateau);
  size_t index_of(const NodeOptions& n) const { return static_cast<size_t>(&n - nodes_.data()); }

  // Per value, by Value::id (a graph's ids are dense).
  template <class T>
  struct ByValue {
    std::vector<T> items;
    T& operator[](const Value* v) {
      if (v->id >= items.size()) items.resize(v->id + 1);
      return items[v->id];
    }
    const T* find(const Value* v) const { return v->id < items.size() ? &items[v->id] : nullptr; }
  };

  StrategyChoice& costs_;
  std::vector<NodeOptions>& nodes_;
  const std::vector<NeededOutput>& needed_;
  ByValue<Needs> needs_;
  std::vector<const Value*> needed_values_;  // the values needs_ holds an entry for, once each
  ByValue<std::vector<const NeededOutput*>> outputs_;  // the graph outputs each value is
  ByValue<NodeOptions*> producer_;
  std::vector<std::vector<NodeOptions*>> followers_;  // by index_of
  ByValue<std::vector<NodeOptions*>> readers_;
  std::vector<char> single_dirty_, compound_dirty_;  // by index_of
  std::vector<uint64_t> reached_;                    // by index_of: mark_around's stamp when it reached the node
  uint64_t stamp_ = 0;
};

}  // namespace dtensor::graph::detail
