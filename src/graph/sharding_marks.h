#pragma once
// Marking a graph with placements: each node's strategy from dtensor's sharding propagation (the same
// rules and cost model as eager dispatch), given the placements of the graph's inputs. Then
// partitioning: reshards inserted where a strategy needs an input elsewhere, local arguments and
// kernels applied, values given their local shapes. Shared by the tensor-parallel transform and
// SPMD expansion.

#include <map>
#include <optional>
#include <vector>

#include "dtensor/graph/program.h"
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

struct MarkOptions {
  // A sharded input reaching a node whose op has no rule is an error (otherwise the node runs on
  // Replicate inputs, noted on the node).
  bool fail_without_rule = false;
  // Parameters, buffers and constants never move by a collective where another strategy exists: the
  // placements given to them are the user's (a tensor-parallel plan shards weights so that they stay).
  bool keep_state_in_place = false;
  // Only this mesh dim may shard or hold partial values; along the others everything stays Replicate.
  std::optional<int64_t> only_mesh_dim;
  // How the strategies are chosen (strategy_choice.h): node by node as eager dispatch does (Greedy),
  // then improved for the whole graph by local search (LocalSearch), then, within a budget of
  // states, the cheapest choice for the whole graph (Exact; the local search's where over budget).
  enum class Search { Greedy, LocalSearch, Exact };
  Search search = Search::LocalSearch;
  // Per graph output, the placements it must end in (see partition); empty: every output Replicate.
  std::vector<std::optional<Placements>> output_targets;
};

// Every node's strategy, and what the sizes read from sharded values are.
struct Marks {
  std::map<const Node*, NodeSharding> nodes;
  ShardedSizes sizes;
  StrategyCosts costs;
};

// Marks every tensor value of `program` in program.annotations (its inputs must be marked there
// already) and returns each node's strategy. A factory whose size is read from a sharded dim makes its part of the output (sym_sizes.h).
Marks mark_sharding(Program& program, const MeshPtr& mesh, const MarkOptions& options);

// Inserts the reshards the marks call for (one per value and target, shared by its consumers),
// applies local arguments and kernels (or a graph form of a kernel, where one exists), gives every
// value its local meta and every size argument its value on this rank, and brings each graph output
// to its target in `output_targets` (one per graph output; nullopt: Partial entries become Replicate,
// shards stay; an empty vector: every output Replicate). Each collective's note says why it is there
// and what it costs by the planner's model (in program.annotations, with the bytes it moves).
void partition(Program& program, const MeshPtr& mesh, Marks& marks,
               const std::vector<std::optional<Placements>>& output_targets = {});

}  // namespace dtensor::graph::detail
