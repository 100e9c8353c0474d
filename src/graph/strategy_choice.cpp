#include "strategy_choice.h"

#include <map>

#include "../sharding/propagation.h"
#include "dtensor/redistribute_plan.h"

namespace dtensor::graph::detail {
namespace {

// The placements the consumers of one value need it in: target -> (placements, how many consumers).
using Needs = std::map<std::string, std::pair<Placements, int>>;

void add_need(Needs& needs, const Placements& to, int count) {
  auto& entry = needs[to_string(to)];
  entry.first = to;
  entry.second += count;
}

}  // namespace

double StrategyChoice::move_cost(const Value* v, const Placements& from, const Placements& to) {
  if (from == to) return 0;
  const auto key = std::make_tuple(v, to_string(from), to_string(to));
  if (auto it = costs_.find(key); it != costs_.end()) return it->second;
  return costs_[key] = dtensor::detail::redistribute_cost(DTensorSpec{mesh_, from, v->meta}, to);
}

bool StrategyChoice::communicates(const Value* v, const Placements& from, const Placements& to) const {
  if (from == to) return false;
  const auto plan = plan_redistribute(v->meta.shape, static_cast<int64_t>(c10::elementSize(v->meta.dtype)), mesh_->shape(),
                                      *mesh_->coordinate(), from, to);
  for (const auto& step : plan.steps)
    if (step.kind != StepKind::LocalChunk && step.kind != StepKind::LocalPartition) return true;
  return false;
}

void StrategyChoice::choose_greedily(NodeOptions& n) {
  std::pair<bool, double> best{true, 0};
  for (size_t o = 0; o < n.options.size(); ++o) {
    const PlacementStrategy& st = n.options[o].chosen;
    double moves = 0;
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k]) moves += move_cost(n.inputs[k], *n.inputs[k]->placements, st.inputs[k]);
    const std::pair<bool, double> cost{moves > 0, moves + st.kernel_cost};
    if (o == 0 || cost < best) {
      best = cost;
      n.chosen = o;
    }
  }
  const PlacementStrategy& st = n.options[n.chosen].chosen;
  for (size_t k = 0; k < n.outputs.size() && k < st.outputs.size(); ++k) n.outputs[k]->placements = st.outputs[k];
}

std::pair<double, double> StrategyChoice::improve(std::vector<NodeOptions>& nodes, const std::vector<Value*>& needed_replicate) {
  std::map<const Value*, Needs> needs;
  for (const NodeOptions& n : nodes)
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k]) add_need(needs[n.inputs[k]], n.options[n.chosen].chosen.inputs[k], 1);
  for (const Value* v : needed_replicate) add_need(needs[v], Placements(mesh_->ndim(), Replicate()), 1);

  // What the reshards of `v`, placed `at`, cost for the consumers' needs (one reshard per target).
  auto value_cost = [&](const Value* v, const Placements& at, const Needs& of) {
    double cost = 0;
    for (const auto& [key, need] : of)
      if (need.second > 0) cost += move_cost(v, at, need.first);
    return cost;
  };
  auto total = [&] {
    double cost = 0;
    for (const auto& [v, of] : needs) cost += value_cost(v, *v->placements, of);
    for (const NodeOptions& n : nodes) cost += n.options[n.chosen].chosen.kernel_cost;
    return cost;
  };
  // The change in total cost if node `n` switched to option `o`.
  auto delta_of = [&](const NodeOptions& n, size_t o) {
    const PlacementStrategy& now = n.options[n.chosen].chosen;
    const PlacementStrategy& alt = n.options[o].chosen;
    double delta = alt.kernel_cost - now.kernel_cost;
    std::map<const Value*, Needs> changed;  // the inputs' needs after the switch
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (!n.inputs[k]) continue;
      Needs& after = changed.try_emplace(n.inputs[k], needs[n.inputs[k]]).first->second;
      add_need(after, now.inputs[k], -1);
      add_need(after, alt.inputs[k], 1);
    }
    for (const auto& [v, after] : changed)
      delta += value_cost(v, *v->placements, after) - value_cost(v, *v->placements, needs[v]);
    for (size_t k = 0; k < n.outputs.size(); ++k)
      delta += value_cost(n.outputs[k], alt.outputs[k], needs[n.outputs[k]]) -
               value_cost(n.outputs[k], now.outputs[k], needs[n.outputs[k]]);
    return delta;
  };

  const double before = total();
  constexpr int kMaxSweeps = 16;  // each sweep strictly lowers the cost; in practice 2-3 suffice
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    bool changed = false;
    for (NodeOptions& n : nodes) {
      if (n.fixed) continue;
      std::optional<size_t> best;
      double best_delta = -1e-6;  // only real improvements: ties keep the greedy choice
      for (size_t o = 0; o < n.options.size(); ++o) {
        if (o == n.chosen) continue;
        if (const double d = delta_of(n, o); d < best_delta) {
          best_delta = d;
          best = o;
        }
      }
      if (!best) continue;
      const PlacementStrategy& now = n.options[n.chosen].chosen;
      const PlacementStrategy& alt = n.options[*best].chosen;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        if (!n.inputs[k]) continue;
        add_need(needs[n.inputs[k]], now.inputs[k], -1);
        add_need(needs[n.inputs[k]], alt.inputs[k], 1);
      }
      for (size_t k = 0; k < n.outputs.size(); ++k) n.outputs[k]->placements = alt.outputs[k];
      n.chosen = *best;
      changed = true;
    }
    if (!changed) break;
  }
  return {before, total()};
}

}  // namespace dtensor::graph::detail
