#pragma once
// SPMD expansion (seed 001, _spmd/distribute.py): an exported program plus the placements of its
// inputs becomes this rank's program. Data parallel (the batch Shard(0) on a "dp" mesh dim), tensor
// parallel (weights placed by a plan on "tp"), or both on a 2-d mesh; forward programs and joint
// forward+backward ones (torch.export.experimental._export_forward_backward) alike, so one call of
// the expanded joint program is one training step's compute and communication.
//
//   auto program = dtensor::graph::load_program("gpt_joint.pt2");
//   dtensor::graph::SpmdPlacements where;
//   where.user_inputs = {{Shard(0), Replicate()}, {Shard(0), Replicate()}};   // tokens, targets
//   where.state = dtensor::graph::plan_placements(program, *mesh, plan, {.tp_dim = "tp"});
//   auto step = dtensor::graph::spmd_expand(std::move(program), mesh, where);
//   std::cout << dtensor::graph::collectives_report(step);           // every collective and why
//   auto outs = dtensor::graph::run(step, dtensor::graph::local_user_inputs(step, {tokens, targets}));
//   // outs: the loss, then each parameter's gradient, placed as the parameter (this rank's shard)
//
// What it does:
//  - every node marked by dtensor's own sharding propagation from the input placements; a node whose
//    op has no rule, reached by a sharded or partial input, is an error naming it (nothing is
//    replicated silently);
//  - the strategies chosen for the whole graph: the cheapest total of bytes moved under the
//    planner's cost model, by dynamic programming over the graph (strategy_choice.h), local search
//    where the exact search is over its budget; the figures against node-by-node choice are in
//    Program::strategy_costs;
//  - reshards inserted as _c10d_functional collectives, each noted with the node it serves, the
//    placements it changes and its cost;
//  - outputs brought to their placements: a gradient to its parameter's (a parameter replicated over
//    dp gets its gradient all-reduced over dp in the graph: the average over the global batch, as
//    the loss is its mean), a buffer mutation to its buffer's, the loss and other outputs Replicate
//    where they end Partial (the seed's rule), shards staying unless the caller names placements;
//  - sizes read from sharded dims (DSymInt, see src/graph/sym_sizes.h) given their local or global
//    value wherever consumed, so a dynamic-batch export runs at any batch that divides evenly;
//  - the state sharded: each rank reads only its part of every weight.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/graph/program.h"
#include "dtensor/graph/tensor_parallel.h"

namespace dtensor::graph {

struct SpmdPlacements {
  // One per user input, in order (tensor inputs; an integer input takes Replicate). Empty: all
  // Replicate.
  std::vector<Placements> user_inputs;
  // Parameters, buffers and constants by FQN; those not named are Replicate.
  std::map<std::string, Placements> state;
  // Graph outputs by index (in Program::outputs) that must come back in given placements; the
  // others follow the rules above.
  std::map<size_t, Placements> outputs;
  // Modules whose activations stay sharded along the sequence (plan_sequence_parallel: a plan's
  // SequenceParallel entries, over its tensor-parallel dim, and over SpmdOptions::context_parallel_dim
  // where one is set). Their nodes must record module paths (the training or core-ATen IR).
  std::vector<SequenceShardedModule> sequence_sharded;
};

struct SpmdOptions {
  enum class Search { Greedy, LocalSearch, Exact, Auto };
  // How the strategies are chosen: node by node (PyTorch's way), improved by local search, or the
  // cheapest for the whole graph (falling back to local search past its budget of states). Auto, the
  // default: the local search, and the exact search where the graph is small enough for it to finish
  // (it gave up on every joint graph of bench/results/expansion.md, having cost 8-41% more time).
  Search search = Search::Auto;
  // Whether the user inputs stay as placed wherever a strategy allows it. The choice counts bytes
  // moved, not the work and memory a shard saves, so without this a sequence sharded for context
  // parallelism may be gathered (its token ids are few bytes) and the whole model run on every rank.
  bool keep_user_inputs_in_place = true;
  // A mesh dim (by name) over which attention runs context parallel: every attention node, forward
  // and backward, that can keep its queries sharded along the sequence over it does (ring or
  // all-to-all, as set_context_parallel_attention says; the sequence kernels' graph form where the
  // program is saved). Empty: attention is placed by cost like every node, which at short sequences may
  // gather the sequence or exchange it for the batch (cheaper in bytes, but not context parallel).
  std::string context_parallel_dim;
};

// Raises DTensorError, before any work, for placements that do not fit the program: a count of user
// input placements other than the program's, a state name it does not have (the error lists its
// names), placements of a length other than the mesh's ndim, a shard dim the tensor does not have, a
// joint graph with gradients but no loss output, and a node whose op has no rule reached by a
// sharded or partial input.
Program spmd_expand(Program program, const MeshPtr& mesh, const SpmdPlacements& placements, const SpmdOptions& options = {});

// This rank's parts of the user inputs of an expanded program, cut from the global ones as their
// placements say. A dynamic dim sharded over n ranks must divide by n (sizes read from it are then
// chunks of the global ones): a batch that does not gets an error naming the input, its size and n.
std::vector<c10::IValue> local_user_inputs(const Program& expanded, const std::vector<c10::IValue>& global_inputs);

// Every collective of an expanded program, in order: the node, its op, why it is there (the node it
// serves and the placements it changes) and the bytes this rank receives.
struct CollectiveNote {
  std::string node, op, why;
  int64_t bytes_per_rank = 0;
};
std::vector<CollectiveNote> collectives(const Program& expanded);
// The same as text, one line each, with counts per op at the end.
std::string collectives_report(const Program& expanded);

}  // namespace dtensor::graph
