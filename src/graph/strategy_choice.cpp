#include "strategy_choice.h"

#include "local_search.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "../sharding/for_graph.h"
#include "dtensor/redistribute_plan.h"

namespace dtensor::graph::detail {
namespace {

auto fields(const Placement& p) { return std::make_tuple(p.kind(), p.reduce_op(), p.dim(), p.split_factor()); }

// A placement list as one integer, 16 bits a mesh dim (kind 3 bits, reduction 2, tensor dim < 32, split
// factor < 64); nullopt for lists beyond that (more than 4 mesh dims, or larger dims), which go uncached.
std::optional<uint64_t> pack_placements(const Placements& placements) {
  if (placements.size() > 4) return std::nullopt;
  uint64_t out = 0;
  for (const Placement& p : placements) {
    if (p.dim() < 0 || p.dim() >= 32 || p.split_factor() < 0 || p.split_factor() >= 64) return std::nullopt;
    const auto bits = static_cast<uint64_t>(p.kind()) | static_cast<uint64_t>(p.reduce_op()) << 3 |
                      static_cast<uint64_t>(p.dim()) << 5 | static_cast<uint64_t>(p.split_factor()) << 10;
    out = out << 16 | bits;
  }
  return out << 2 | placements.size();  // the count tells lists of Replicate apart
}

}  // namespace

bool PlacementsLess::operator()(const Placements& a, const Placements& b) const {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                      [](const Placement& x, const Placement& y) { return fields(x) < fields(y); });
}

const double* StrategyChoice::MoveCache::find(const Value* v, uint64_t from, uint64_t to) const {
  if (v->id >= by_value_.size()) return nullptr;
  for (const CachedMove& m : by_value_[v->id])
    if (m.from == from && m.to == to) return &m.cost;
  return nullptr;
}

double StrategyChoice::MoveCache::store(const Value* v, uint64_t from, uint64_t to, double cost) {
  if (v->id >= by_value_.size()) by_value_.resize(v->id + 1);
  by_value_[v->id].push_back({from, to, cost});
  return cost;
}

double StrategyChoice::move_cost(const Value* v, const Placements& from, const Placements& to) {
  if (from == to) return 0;
  const auto from_key = pack_placements(from), to_key = pack_placements(to);
  auto compute = [&] { return dtensor::detail::redistribute_cost(DTensorSpec{mesh_, from, v->meta}, to); };
  if (!from_key || !to_key) return compute();
  if (const double* cached = costs_.find(v, *from_key, *to_key)) return *cached;
  return costs_.store(v, *from_key, *to_key, compute());
}

void StrategyChoice::count_output_reductions(const std::vector<NeededOutput>& needed) {
  int reduced = 0;
  for (const NeededOutput& o : needed) {
    const Placements& from = at(o.value);
    const auto plan = plan_redistribute(o.value->meta.shape, static_cast<int64_t>(c10::elementSize(o.value->meta.dtype)),
                                        mesh_->shape(), *mesh_->coordinate(), from, o.target_from(from));
    reduced += std::any_of(plan.steps.begin(), plan.steps.end(), [](const RedistributeStep& s) { return s.kind == StepKind::AllReduce; });
  }
  shared_bucket_ = reduced > 1;
}

double StrategyChoice::output_move_cost(const Value* v, const Placements& from, const Placements& to) {
  const double cost = move_cost(v, from, to);
  if (cost == 0 || !shared_bucket_) return cost;
  const auto from_key = pack_placements(from), to_key = pack_placements(to);
  const bool cacheable = from_key && to_key;
  if (const double* cached = cacheable ? output_costs_.find(v, *from_key, *to_key) : nullptr) return *cached;
  const auto plan = plan_redistribute(v->meta.shape, static_cast<int64_t>(c10::elementSize(v->meta.dtype)), mesh_->shape(),
                                      *mesh_->coordinate(), from, to);
  double latencies = 0;
  for (const auto& step : plan.steps) latencies += step.kind == StepKind::AllReduce ? kCollectiveLatencyBytes : 0;
  const double discounted = std::max(0.0, cost - latencies);
  return cacheable ? output_costs_.store(v, *from_key, *to_key, discounted) : discounted;
}

bool StrategyChoice::moves_in_place(const Value* v, const Placements& from, const Placements& to) const {
  if (from == to) return true;
  const auto plan = plan_redistribute(v->meta.shape, static_cast<int64_t>(c10::elementSize(v->meta.dtype)), mesh_->shape(),
                                      *mesh_->coordinate(), from, to);
  return std::all_of(plan.steps.begin(), plan.steps.end(), [](const RedistributeStep& s) {
    return s.kind == StepKind::LocalChunk || s.kind == StepKind::LocalPartition;
  });
}

bool StrategyChoice::communicates(const Value* v, const Placements& from, const Placements& to) const {
  if (from == to) return false;
  const auto plan = plan_redistribute(v->meta.shape, static_cast<int64_t>(c10::elementSize(v->meta.dtype)), mesh_->shape(),
                                      *mesh_->coordinate(), from, to);
  for (const auto& step : plan.steps)
    if (is_collective(step.kind)) return true;
  return false;
}

void StrategyChoice::choose_greedily(NodeOptions& n, Greedy policy) {
  // Lexicographic: anything moved at all, then (under PartialToReplicate) Partial entries scattered,
  // then the cost.
  std::tuple<bool, int, double> best{true, 0, 0};
  auto moves_a_written_input = [&](const PlacementStrategy& st) {
    for (size_t k = 0; k < n.written.size() && k < n.inputs.size(); ++k)
      if (n.written[k] && n.inputs[k] && at(n.inputs[k]) != st.inputs[k]) return true;
    return false;
  };
  const bool some_write_in_place = std::any_of(n.options.begin(), n.options.end(),
                                               [&](const OutputSharding& d) { return !moves_a_written_input(d.chosen); });
  bool any = false;
  for (size_t o = 0; o < n.options.size(); ++o) {
    const PlacementStrategy& st = n.options[o].chosen;
    if (some_write_in_place && moves_a_written_input(st)) continue;
    double moves = 0;
    bool moved = false;  // any input placed otherwise, a free local chunk included
    int scattered = 0;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (!n.inputs[k]) continue;
      const Placements& from = at(n.inputs[k]);
      if (policy == Greedy::PartialToReplicateOnce && moves_made_.count({n.inputs[k], to_string(st.inputs[k])})) continue;
      moves += move_cost(n.inputs[k], from, st.inputs[k]);
      moved = moved || from != st.inputs[k];
      for (size_t m = 0; policy != Greedy::Cheapest && m < from.size(); ++m)
        scattered += from[m].is_partial() && st.inputs[k][m].is_shard();
    }
    const std::tuple<bool, int, double> cost{moved, scattered, moves + st.kernel_cost};
    if (!any || cost < best) {
      best = cost;
      n.chosen = o;
      any = true;
    }
  }
  const PlacementStrategy& st = n.options[n.chosen].chosen;
  for (size_t k = 0; k < n.outputs.size() && k < st.outputs.size(); ++k) place(n.outputs[k], st.outputs[k]);
  for (size_t k = 0; policy == Greedy::PartialToReplicateOnce && k < n.inputs.size(); ++k)
    if (n.inputs[k] && at(n.inputs[k]) != st.inputs[k]) moves_made_.insert({n.inputs[k], to_string(st.inputs[k])});
}

void StrategyChoice::choose_all_greedily(std::vector<NodeOptions>& nodes, Greedy policy) {
  moves_made_.clear();
  for (NodeOptions& n : nodes) choose_greedily(n, policy);
}

bool is_view_like(const Node& node) {
  static const std::set<std::string> views = {"aten::permute", "aten::t",      "aten::transpose.int", "aten::view",
                                              "aten::_unsafe_view", "aten::reshape", "aten::expand", "aten::alias",
                                              "aten::detach", "aten::unsqueeze", "aten::squeeze.dim", "aten::clone"};
  return node.op && views.count(node.op_name()) > 0;
}

Placements NeededOutput::target_from(const Placements& at) const {
  if (target) return *target;
  Placements p = at;
  for (auto& x : p)
    if (x.is_partial()) x = Replicate();
  return p;
}

std::pair<double, double> StrategyChoice::improve(std::vector<NodeOptions>& nodes, const std::vector<NeededOutput>& needed) {
  return LocalSearch(*this, nodes, needed).run();
}

double StrategyChoice::total_cost(const std::vector<NodeOptions>& nodes, const std::vector<NeededOutput>& needed) {
  count_output_reductions(needed);
  // Per value: the distinct targets, and whether a node (not only the graph's outputs) needs each.
  std::map<const Value*, std::map<std::string, std::pair<Placements, bool>>> targets;
  for (const NodeOptions& n : nodes)
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k]) {
        const Placements& t = n.options[n.chosen].chosen.inputs[k];
        targets[n.inputs[k]][to_string(t)] = {t, true};
      }
  for (const NeededOutput& o : needed) {
    const Placements t = o.target_from(at(o.value));
    targets[o.value].emplace(to_string(t), std::make_pair(t, false));
  }
  double cost = 0;
  for (const auto& [v, of] : targets)
    for (const auto& [key, target] : of)
      cost += target.second ? move_cost(v, at(v), target.first) : output_move_cost(v, at(v), target.first);
  for (const NodeOptions& n : nodes) cost += n.options[n.chosen].chosen.kernel_cost;
  return cost;
}

namespace {

// The dynamic program of search_exactly: nodes in graph order; at step i the state is what the rest
// of the graph depends on, the placements of the values live across i and the reshards of them
// already paid for.
class ExactSearch {
 public:
  ExactSearch(StrategyChoice& choice, std::vector<NodeOptions>& nodes, const std::vector<NeededOutput>& needed, size_t max_states)
      : choice_(choice), nodes_(nodes), needed_(needed), max_states_(max_states) {
    std::map<const Value*, size_t> defined;  // index of the node that sets its placements (+1; 0: fixed)
    for (size_t i = 0; i < nodes_.size(); ++i)
      for (Value* v : nodes_[i].outputs) defined[v] = i + 1;
    std::map<const Value*, size_t> last;
    for (size_t i = 0; i < nodes_.size(); ++i)
      for (Value* v : nodes_[i].inputs)
        if (v) last[v] = i;
    for (const NeededOutput& o : needed_) last[o.value] = nodes_.size();
    live_.resize(nodes_.size() + 1);
    for (const auto& [v, end] : last) {
      const size_t begin = defined.count(v) ? defined.at(v) : 0;
      for (size_t i = begin; i <= end; ++i) live_[i].push_back(v);
    }
  }

  // The least cost of steps i.. from the current state if it is below `bound`; otherwise a lower
  // bound of it that is at least `bound` (branch and bound: a partial cost reaching the bound ends a
  // branch, so the search only explores choices that could beat the best known one).
  double solve(size_t i, double bound) {
    if (i == nodes_.size()) {
      double cost = 0;
      std::vector<std::pair<const Value*, std::string>> paid;
      for (const NeededOutput& o : needed_) cost += pay(o.value, o.target_from(choice_.at(o.value)), paid, /*output=*/true);
      for (const auto& [v, target] : paid) paid_[v].erase(target);
      return cost;
    }
    // A state's key spells every value live across step i: a joint graph keeps thousands of
    // activations live for its backward, and a search spelling them at each of its states would
    // spend seconds before giving up. Keys are budgeted as states are, at an average of
    // kLiveValuesPerState values each.
    key_work_ += live_[i].size();
    if (key_work_ > max_states_ * kLiveValuesPerState) throw OverBudget{};
    const std::string key = state_key(i);
    if (auto it = memo_.find(key); it != memo_.end() && (it->second.exact || it->second.cost >= bound)) return it->second.cost;
    if (memo_.size() >= max_states_) throw OverBudget{};
    NodeOptions& n = nodes_[i];
    double best = std::numeric_limits<double>::infinity();
    size_t best_option = n.chosen;
    const size_t first = n.fixed ? n.chosen : 0, end = n.fixed ? n.chosen + 1 : n.options.size();
    for (size_t o = first; o < end; ++o) {
      const double limit = std::min(best, bound);
      const PlacementStrategy& st = n.options[o].chosen;
      std::vector<std::pair<const Value*, std::string>> paid;
      double cost = st.kernel_cost;
      for (size_t k = 0; k < n.inputs.size(); ++k)
        if (n.inputs[k]) cost += pay(n.inputs[k], st.inputs[k], paid);
      if (cost < limit) {
        std::vector<Placements> before;
        for (size_t k = 0; k < n.outputs.size(); ++k) {
          before.push_back(choice_.at(n.outputs[k]));
          choice_.place(n.outputs[k], st.outputs[k]);
        }
        cost += solve(i + 1, limit - cost);
        if (cost < best) {
          best = cost;
          best_option = o;
        }
        for (size_t k = 0; k < n.outputs.size(); ++k) choice_.place(n.outputs[k], before[k]);
      }
      for (const auto& [v, target] : paid) paid_[v].erase(target);
    }
    const bool exact = best < bound;
    memo_[key] = {exact ? best : bound, best_option, exact};
    return memo_[key].cost;
  }

  // Applies the best choices found, in order, following the states they lead to.
  void apply() {
    std::vector<std::pair<const Value*, std::string>> paid;  // kept: the states ahead include them
    for (size_t i = 0; i < nodes_.size(); ++i) {
      NodeOptions& n = nodes_[i];
      n.chosen = memo_.at(state_key(i)).option;
      const PlacementStrategy& st = n.options[n.chosen].chosen;
      for (size_t k = 0; k < n.inputs.size(); ++k)
        if (n.inputs[k]) pay(n.inputs[k], st.inputs[k], paid);
      for (size_t k = 0; k < n.outputs.size(); ++k) choice_.place(n.outputs[k], st.outputs[k]);
    }
  }

  struct OverBudget {};

 private:
  // The cost of moving v to `to` unless already paid; records the payment (in `paid`, to undo).
  // (`output`: for a graph output, whose all-reduces are bucketed.)
  double pay(const Value* v, const Placements& to, std::vector<std::pair<const Value*, std::string>>& paid, bool output = false) {
    std::string target = to_string(to);
    if (!paid_[v].insert(target).second) return 0;
    paid.emplace_back(v, std::move(target));
    return output ? choice_.output_move_cost(v, choice_.at(v), to) : choice_.move_cost(v, choice_.at(v), to);
  }

  std::string state_key(size_t i) {
    std::string key = std::to_string(i);
    for (const Value* v : live_[i]) {
      key += '|';
      key += to_string(choice_.at(v));
      if (auto it = paid_.find(v); it != paid_.end())
        for (const std::string& t : it->second) key += "+" + t;
    }
    return key;
  }

  StrategyChoice& choice_;
  std::vector<NodeOptions>& nodes_;
  const std::vector<NeededOutput>& needed_;
  size_t max_states_;
  static constexpr size_t kLiveValuesPerState = 64;
  size_t key_work_ = 0;  // live values spelled into state keys so far
  std::vector<std::vector<const Value*>> live_;
  std::map<const Value*, std::set<std::string>> paid_;
  struct Entry {
    double cost;    // the least cost from the state, or a lower bound of it when not exact
    size_t option;  // the option giving it (exact entries)
    bool exact;
  };
  std::unordered_map<std::string, Entry> memo_;
};

}  // namespace

std::optional<double> StrategyChoice::search_exactly(std::vector<NodeOptions>& nodes, const std::vector<NeededOutput>& needed,
                                                     size_t max_states) {
  count_output_reductions(needed);
  std::vector<std::vector<Placements>> kept;
  for (const NodeOptions& n : nodes) {
    kept.emplace_back();
    for (const Value* v : n.outputs) kept.back().push_back(at(v));
  }
  // Bounded by the current choice's cost: a result below it is a better choice; none proves the
  // current one the cheapest.
  const double current = total_cost(nodes, needed);
  constexpr double kSlack = 1;  // a byte: ties keep the current choice
  ExactSearch search(*this, nodes, needed, max_states);
  try {
    if (search.solve(0, current - kSlack) >= current - kSlack) return current;
  } catch (const ExactSearch::OverBudget&) {
    for (size_t i = 0; i < nodes.size(); ++i)
      for (size_t k = 0; k < nodes[i].outputs.size(); ++k) place(nodes[i].outputs[k], kept[i][k]);
    return std::nullopt;
  }
  search.apply();
  return total_cost(nodes, needed);
}

}  // namespace dtensor::graph::detail
