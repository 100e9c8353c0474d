#pragma once
// The strategy problem of a program: for every node, the strategies dtensor's sharding propagation
// offers (the same rules and cost model as eager dispatch), given the placements of the graph's
// inputs; the values that must end in given placements; and the cost model over them. Made by
// enumerate_strategies, solved by solve (strategy_choice.h and local_search.h do the searching); the
// moves the solution calls for are then written by write_moves (sharding_marks.h).

#include <map>
#include <optional>
#include <vector>

#include "dtensor/graph/program.h"
#include "dtensor/graph/tensor_parallel.h"
#include "strategy_choice.h"
#include "sym_sizes.h"

namespace dtensor::graph::detail {

// How one node runs on the mesh.
struct NodeSharding {
  std::vector<size_t> tensor_args;  // per tensor input of the strategy: its argument index
  std::vector<int64_t> list_index;  // ... and its position in a tensor list (-1 for a Tensor argument)
  std::vector<std::optional<Placements>> moves;  // per tensor input: where it must be first
  LocalArgs local_args;
  LocalKernel local_kernel;
  GraphForm graph_form;  // the local kernel as graph ops, where its rule gives one
  bool no_rule = false;  // the op has no sharding rule: it ran on Replicate inputs
};

// The value read by a node's strategy input k.
Value* input_slot(const Node& node, const NodeSharding& s, size_t k);

struct MarkOptions {
  // A sharded input reaching a node whose op has no rule is an error (otherwise the node runs on
  // Replicate inputs, noted on the node).
  bool fail_without_rule = false;
  // Parameters, buffers and constants never move by a collective where another strategy exists: the
  // placements given to them are the user's (a tensor-parallel plan shards weights so that they stay).
  bool keep_state_in_place = false;
  // The same for the user inputs: placed as the caller placed them (a sequence sharded for context
  // parallelism stays sharded, though gathering its token ids would move fewer bytes: the cost counts
  // bytes moved, not the work and memory a shard saves).
  bool keep_user_inputs_in_place = false;
  // Only this mesh dim may shard or hold partial values; along the others everything stays Replicate.
  std::optional<int64_t> only_mesh_dim;
  // Attention nodes keep their queries sharded along the sequence over this mesh dim wherever their
  // rule offers that (SpmdOptions::context_parallel_dim).
  std::optional<int64_t> context_parallel_dim;
  // Modules whose nodes keep their outputs sharded along the sequence (SpmdPlacements::sequence_sharded).
  std::vector<SequenceShardedModule> sequence_sharded;
  // How the strategies are chosen (strategy_choice.h): node by node as eager dispatch does (Greedy),
  // then improved for the whole graph by local search (LocalSearch), then, within a budget of
  // states, the cheapest choice for the whole graph (Exact; the local search's where over budget).
  // Auto: the local search, and the exact search too where the problem is small enough for it to
  // finish (on larger ones it gives up having cost up to 41% more time, bench/results/expansion.md).
  enum class Search { Greedy, LocalSearch, Exact, Auto };
  Search search = Search::Auto;
  // Per graph output, the placements it must end in (see partition); empty: every output Replicate.
  std::vector<std::optional<Placements>> output_targets;
};

// Every node's strategy, and what the sizes read from sharded values are.
struct Marks {
  std::map<const Node*, NodeSharding> nodes;
  ShardedSizes sizes;
  StrategyCosts costs;
};

struct StrategyProblem {
  Marks marks;                       // per node how its inputs are read; sizes; costs once solved
  std::vector<NodeOptions> nodes;    // the nodes with a rule, in graph order: options and choice
  std::vector<NeededOutput> needed;  // graph outputs and the placements they must end in
  StrategyChoice choice;             // the cost model; reads and writes the program's placements
};

// Marks every tensor value of `program` in program.annotations as the node-by-node choice places it
// (its inputs must be marked there already), and returns every node's options. A factory whose size
// is read from a sharded dim makes its part of the output (sym_sizes.h).
StrategyProblem enumerate_strategies(Program& program, const MeshPtr& mesh, const MarkOptions& options);

// Chooses every node's strategy by `search`, placing the values as chosen; sets problem.marks.costs.
void solve(StrategyProblem& problem, MarkOptions::Search search);

}  // namespace dtensor::graph::detail
