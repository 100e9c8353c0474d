#include "local_search.h"

#include <algorithm>
#include <optional>

namespace dtensor::graph::detail {
namespace {

// Partial entries among a strategy's outputs: fewer is "more resolved".
int partials(const PlacementStrategy& st) {
  int n = 0;
  for (const auto& p : st.outputs)
    for (const auto& x : p) n += x.is_partial();
  return n;
}

constexpr double kDrop = -1e-6;  // a change must lower the total by more than rounding
constexpr int kProducerDepth = 4;
// Producers pulled, each reading its own neighbourhood, plus room for chains of views.
constexpr int kCompoundReach = kProducerDepth + 4;

}  // namespace

LocalSearch::LocalSearch(StrategyChoice& costs, std::vector<NodeOptions>& nodes, const std::vector<NeededOutput>& needed)
    : costs_(costs), nodes_(nodes), needed_(needed), followers_(nodes.size()) {
  std::vector<char> tracked;
  auto track = [&](const Value* v) {
    if (v->id >= tracked.size()) tracked.resize(v->id + 1);
    if (!tracked[v->id]) needed_values_.push_back(v);
    tracked[v->id] = 1;
  };
  for (const NodeOptions& n : nodes_)
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k]) {
        track(n.inputs[k]);
        add_need(needs_[n.inputs[k]], n.options[n.chosen].chosen.inputs[k], 1);
      }
  for (const NeededOutput& o : needed) {
    outputs_[o.value].push_back(&o);
    track(o.value);
    needs_[o.value];
  }
  for (NodeOptions& n : nodes_) {
    for (Value* v : n.outputs) producer_[v] = &n;
    for (Value* v : n.inputs)
      if (v) readers_[v].push_back(&n);
  }
  for (NodeOptions& n : nodes_) {
    if (n.fixed || n.inputs.size() != 1 || !n.inputs[0] || !n.node || !is_view_like(*n.node)) continue;
    if (NodeOptions* const* p = producer_.find(n.inputs[0]); p && *p) followers_[index_of(**p)].push_back(&n);
  }
}

void LocalSearch::add_need(Needs& needs, const Placements& to, int count) {
  for (auto& [target, n] : needs)
    if (target == to) {
      n += count;
      return;
    }
  needs.emplace_back(to, count);
}

double LocalSearch::value_cost(const Value* v, const Placements& at, const Needs& of, const NeedChanges& changes) {
  // Each distinct target is one reshard, paid once: for its consumers (with `changes` applied), or
  // else as the graph output the value is. A value read by many nodes has dozens of targets, so each
  // is looked at once (`of` holds each target once; `changes` and the outputs are a few).
  c10::SmallVector<Placements, 2> output_targets;
  if (const auto* outputs = outputs_.find(v))
    for (const NeededOutput* o : *outputs) output_targets.push_back(o->target_from(at));
  auto in_needs = [&](const Placements& target) {
    return std::any_of(of.begin(), of.end(), [&](const auto& need) { return need.first == target; });
  };
  auto pay = [&](const Placements& target, int consumers) {
    if (consumers > 0) return costs_.move_cost(v, at, target);
    if (std::find(output_targets.begin(), output_targets.end(), target) != output_targets.end())
      return costs_.output_move_cost(v, at, target);
    return 0.0;
  };
  auto changed_by = [&](const Placements& target) {
    int by = 0;
    for (const auto& [changed, delta] : changes) by += *changed == target ? delta : 0;
    return by;
  };
  double cost = 0;
  for (const auto& [target, count] : of) cost += pay(target, count + changed_by(target));
  for (size_t i = 0; i < changes.size(); ++i) {
    const Placements& target = *changes[i].first;
    bool earlier = in_needs(target);
    for (size_t j = 0; j < i && !earlier; ++j) earlier = *changes[j].first == target;
    if (!earlier) cost += pay(target, changed_by(target));
  }
  for (size_t i = 0; i < output_targets.size(); ++i) {
    const Placements& target = output_targets[i];
    bool earlier = in_needs(target);
    for (const auto& change : changes) earlier = earlier || *change.first == target;
    for (size_t j = 0; j < i && !earlier; ++j) earlier = output_targets[j] == target;
    if (!earlier) cost += pay(target, 0);
  }
  return cost;
}

const LocalSearch::Needs& LocalSearch::needs_of(const Value* v) const {
  static const Needs none;
  const Needs* needs = needs_.find(v);
  return needs ? *needs : none;
}

double LocalSearch::total() {
  double cost = 0;
  for (const Value* v : needed_values_) cost += value_cost(v, costs_.at(v), needs_of(v));
  for (const NodeOptions& n : nodes_) cost += n.options[n.chosen].chosen.kernel_cost;
  return cost;
}

double LocalSearch::delta_of(const NodeOptions& n, size_t o) {
  const PlacementStrategy& now = n.options[n.chosen].chosen;
  const PlacementStrategy& alt = n.options[o].chosen;
  double delta = alt.kernel_cost - now.kernel_cost;
  c10::SmallVector<std::pair<const Value*, NeedChanges>, 4> changed;  // the inputs' needs the switch changes
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    if (!n.inputs[k] || now.inputs[k] == alt.inputs[k]) continue;
    auto it = std::find_if(changed.begin(), changed.end(), [&](const auto& c) { return c.first == n.inputs[k]; });
    if (it == changed.end()) it = changed.insert(changed.end(), {n.inputs[k], {}});
    it->second.push_back({&now.inputs[k], -1});
    it->second.push_back({&alt.inputs[k], 1});
  }
  for (const auto& [v, changes] : changed)
    delta += value_cost(v, costs_.at(v), needs_of(v), changes) - value_cost(v, costs_.at(v), needs_of(v));
  for (size_t k = 0; k < n.outputs.size(); ++k)
    delta += value_cost(n.outputs[k], alt.outputs[k], needs_of(n.outputs[k])) - value_cost(n.outputs[k], now.outputs[k], needs_of(n.outputs[k]));
  return delta;
}

void LocalSearch::apply(NodeOptions& n, size_t o) {
  const PlacementStrategy& now = n.options[n.chosen].chosen;
  const PlacementStrategy& alt = n.options[o].chosen;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    if (!n.inputs[k]) continue;
    add_need(needs_[n.inputs[k]], now.inputs[k], -1);
    add_need(needs_[n.inputs[k]], alt.inputs[k], 1);
  }
  for (size_t k = 0; k < n.outputs.size(); ++k) costs_.place(n.outputs[k], alt.outputs[k]);
  n.chosen = o;
}

void LocalSearch::revert(Undo& undo) {
  for (auto it = undo.rbegin(); it != undo.rend(); ++it) apply(*it->first, it->second);
}

bool LocalSearch::reshards_around(const NodeOptions& n) {
  const PlacementStrategy& now = n.options[n.chosen].chosen;
  for (size_t k = 0; k < n.inputs.size(); ++k)
    if (n.inputs[k] && now.inputs[k] != costs_.at(n.inputs[k])) return true;
  for (const Value* v : n.outputs) {
    for (const auto& [target, count] : needs_of(v))
      if (count > 0 && target != costs_.at(v)) return true;
    if (const auto* outputs = outputs_.find(v))
      for (const NeededOutput* o : *outputs)
        if (o->target_from(costs_.at(v)) != costs_.at(v)) return true;
  }
  return false;
}

double LocalSearch::switch_with_followers(NodeOptions& n, size_t o, Undo& undo) {
  double delta = delta_of(n, o);
  undo.emplace_back(&n, n.chosen);
  apply(n, o);
  for (NodeOptions* f : followers_[index_of(n)]) {
    std::optional<size_t> fit;
    double fit_delta = 0;
    for (size_t k = 0; k < f->options.size(); ++k) {
      if (f->options[k].chosen.inputs[0] != costs_.at(f->inputs[0])) continue;
      if (const double d = k == f->chosen ? 0.0 : delta_of(*f, k); !fit || d < fit_delta) {
        fit = k;
        fit_delta = d;
      }
    }
    if (fit && *fit != f->chosen) delta += switch_with_followers(*f, *fit, undo);
  }
  return delta;
}

double LocalSearch::switch_with_producers(NodeOptions& n, size_t o, Undo& undo, int depth) {
  double delta = delta_of(n, o);
  undo.emplace_back(&n, n.chosen);
  apply(n, o);
  if (depth == 0) return delta;
  const PlacementStrategy& chosen = n.options[n.chosen].chosen;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    Value* v = n.inputs[k];
    if (!v || !costs_.communicates(v, costs_.at(v), chosen.inputs[k])) continue;
    NodeOptions* const* producer = producer_.find(v);
    if (!producer || !*producer || (*producer)->fixed) continue;
    NodeOptions& p = **producer;
    const size_t out = static_cast<size_t>(std::find(p.outputs.begin(), p.outputs.end(), v) - p.outputs.begin());
    std::optional<size_t> fit;
    double fit_delta = 0;
    for (size_t q = 0; q < p.options.size(); ++q) {
      if (q == p.chosen || p.options[q].chosen.outputs.at(out) != chosen.inputs[k]) continue;
      if (const double d = delta_of(p, q); !fit || d < fit_delta) {
        fit = q;
        fit_delta = d;
      }
    }
    if (fit) delta += switch_with_producers(p, *fit, undo, depth - 1);
  }
  return delta;
}

bool LocalSearch::improve_compound(NodeOptions& n, Undo& kept) {
  for (size_t o = 0; o < n.options.size() && !followers_[index_of(n)].empty(); ++o) {
    if (o == n.chosen) continue;
    Undo undo;
    if (switch_with_followers(n, o, undo) < kDrop) {
      kept = std::move(undo);
      return true;
    }
    revert(undo);
  }
  // The node as it is, its producers pulled to hand it its inputs as it reads them.
  const PlacementStrategy& now = n.options[n.chosen].chosen;
  bool collective_in = false;
  for (size_t k = 0; k < n.inputs.size(); ++k)
    collective_in = collective_in || (n.inputs[k] && costs_.communicates(n.inputs[k], costs_.at(n.inputs[k]), now.inputs[k]));
  if (!collective_in) return false;
  Undo undo;
  if (switch_with_producers(n, n.chosen, undo, kProducerDepth) < kDrop) {
    kept = std::move(undo);
    return true;
  }
  revert(undo);
  return false;
}

void LocalSearch::mark_all() {
  single_dirty_.assign(nodes_.size(), 1);
  compound_dirty_.assign(nodes_.size(), 1);
}

void LocalSearch::mark_around(const NodeOptions& changed) {
  // Nodes reached in this call carry its stamp, so that nothing is cleared between calls.
  if (reached_.size() != nodes_.size()) reached_.assign(nodes_.size(), 0);
  ++stamp_;
  std::vector<const NodeOptions*> frontier = {&changed}, next;
  reached_[index_of(changed)] = stamp_;
  for (int distance = 0; distance <= kCompoundReach && !frontier.empty(); ++distance) {
    next.clear();
    auto reach = [&](const NodeOptions* n) {
      if (reached_[index_of(*n)] != stamp_) {
        reached_[index_of(*n)] = stamp_;
        next.push_back(n);
      }
    };
    for (const NodeOptions* n : frontier) {
      if (distance <= 1) single_dirty_[index_of(*n)] = 1;
      compound_dirty_[index_of(*n)] = 1;
      for (const Value* v : n->inputs) {
        if (!v) continue;
        if (NodeOptions* const* p = producer_.find(v); p && *p) reach(*p);
        if (const auto* readers = readers_.find(v))
          for (const NodeOptions* r : *readers) reach(r);
      }
      for (const Value* v : n->outputs)
        if (const auto* readers = readers_.find(v))
          for (const NodeOptions* r : *readers) reach(r);
    }
    std::swap(frontier, next);
  }
}

bool LocalSearch::compound_at(NodeOptions& n) {
  compound_dirty_[index_of(n)] = 0;
  Undo kept;
  if (!reshards_around(n) || !improve_compound(n, kept)) return false;
  for (const auto& [switched, previous] : kept) mark_around(*switched);
  return true;
}

std::optional<size_t> LocalSearch::best_switch(NodeOptions& n, bool plateau) {
  std::optional<size_t> best;
  // (Local steps cost a byte each in the model, to break ties: a plateau allows a few.)
  double best_delta = plateau ? 4.5 : kDrop;
  for (size_t o = 0; o < n.options.size(); ++o) {
    if (o == n.chosen) continue;
    if (plateau && partials(n.options[o].chosen) >= partials(n.options[n.chosen].chosen)) continue;
    if (const double d = delta_of(n, o); d < best_delta) {
      best_delta = d;
      best = o;
    }
  }
  return best;
}

bool LocalSearch::sweep(bool plateau) {
  const bool shared_bucket = costs_.shared_bucket();
  costs_.count_output_reductions(needed_);
  if (costs_.shared_bucket() != shared_bucket) mark_all();  // every output's cost changed
  bool changed = false;
  for (NodeOptions& n : nodes_) {
    if (n.fixed) continue;
    const size_t i = index_of(n);
    // A plateau sweep looks at every node: its switches are ones a strict sweep does not take.
    if (!plateau && !single_dirty_[i] && !compound_dirty_[i]) continue;
    if (!plateau && !single_dirty_[i]) {  // its single switches still find nothing
      changed = compound_at(n) || changed;
      continue;
    }
    if (!plateau) single_dirty_[i] = 0;
    if (const auto best = best_switch(n, plateau)) {
      apply(n, *best);
      mark_around(n);
      changed = true;
      continue;
    }
    if (!plateau && compound_dirty_[i]) changed = compound_at(n) || changed;
  }
  return changed;
}

std::pair<double, double> LocalSearch::run() {
  costs_.count_output_reductions(needed_);
  const double before = total();
  // Sweeps of strict improvements. Where none is left, one sweep of free changes that resolve a
  // Partial output (a backward pass recomputing from a value already all-reduced for the forward
  // can then take the reduced copy: two changes, the first of which alone saves nothing); they only
  // ever lower the count of Partial outputs, so they cannot cycle.
  constexpr int kMaxSweeps = 32;
  bool plateau = false;
  mark_all();
  for (int i = 0; i < kMaxSweeps; ++i) {
    const bool changed = sweep(plateau);
    if (plateau) {
      plateau = false;
      if (!changed) break;
    } else if (!changed) {
      plateau = true;
    }
  }
  costs_.count_output_reductions(needed_);
  return {before, total()};
}

}  // namespace dtensor::graph::detail
