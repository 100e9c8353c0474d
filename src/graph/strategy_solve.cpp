#include <vector>

#include "strategy_problem.h"

namespace dtensor::graph::detail {
namespace {

// Problems up to this many nodes with options get the exact search too. Over the graph suites (run
// with every search forced, 2026-12-02) it finished on the hand-built graphs of 3 and 5 nodes and gave
// up on every model, from the GPT's forward (56 nodes) to the Hugging Face joint graphs (692); on the
// joint graphs of bench/results/expansion.md giving up cost 8-41% more time.
constexpr size_t kExactSearchNodes = 32;

// Local search from three starts, node-by-node choice and two of Megatron's (Partial values
// all-reduced; the second reusing a value's all-reduce for all its readers), keeping the cheapest:
// each start sits in a basin single changes cannot leave (a reduce-scatter feeding three gathers of
// views of one value needs four nodes changed at once).
double search_locally(StrategyProblem& p) {
  double cost = p.choice.improve(p.nodes, p.needed).second;
  std::vector<size_t> best;
  for (const NodeOptions& n : p.nodes) best.push_back(n.chosen);
  for (const auto start : {StrategyChoice::Greedy::PartialToReplicate, StrategyChoice::Greedy::PartialToReplicateOnce}) {
    p.choice.choose_all_greedily(p.nodes, start);
    const double started = p.choice.improve(p.nodes, p.needed).second;
    if (started >= cost) continue;
    cost = started;
    for (size_t i = 0; i < p.nodes.size(); ++i) best[i] = p.nodes[i].chosen;
  }
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    NodeOptions& n = p.nodes[i];
    n.chosen = best[i];
    for (size_t k = 0; k < n.outputs.size(); ++k) p.choice.place(n.outputs[k], n.options[n.chosen].chosen.outputs[k]);
  }
  return cost;
}

}  // namespace

void solve(StrategyProblem& p, MarkOptions::Search search) {
  using Search = MarkOptions::Search;
  StrategyCosts& costs = p.marks.costs;
  costs.node_by_node = costs.chosen = p.choice.total_cost(p.nodes, p.needed);
  costs.method = "greedy";
  if (search == Search::Greedy) return;
  costs.chosen = search_locally(p);
  costs.method = "local search";
  const bool exact = search == Search::Exact || (search == Search::Auto && p.nodes.size() <= kExactSearchNodes);
  if (!exact) return;
  if (auto cheapest = p.choice.search_exactly(p.nodes, p.needed)) {
    costs.chosen = *cheapest;
    costs.method = "exact";
  } else {
    costs.method = "local search (exact search over budget)";
  }
}

}  // namespace dtensor::graph::detail
