#pragma once
// Graph-level tensor parallelism (seed 000, tp_transform.py): an exported program plus a parallel plan
// becomes this rank's program, which runs on plain local tensors with every collective already in
// its graph and no DTensor dispatch at run time.
//
//   auto program = dtensor::graph::load_program("gpt.pt2");
//   auto local = dtensor::graph::tensor_parallel_transform(std::move(program), mesh, {
//       {"tok_emb", dtensor::RowwiseParallel{}},              // vocabulary-parallel embedding
//       {"blocks.*.attn.w[qkv]", dtensor::ColwiseParallel{}},
//       {"blocks.*.attn.wo", dtensor::RowwiseParallel{}}, ...});
//   std::cout << local.str();                               // placements and collectives, per node
//   auto logits = dtensor::graph::run(local, {tokens});
//
// What it does, as the seed does on FX graphs:
//  - parameter placements from the plan: a column-parallel Linear's weight and bias Shard(0), a
//    row-parallel one's weight Shard(1) and bias Replicate (Embedding: row-parallel shards the
//    vocabulary, Shard(0); column-parallel the embedding dim, Shard(1); a Conv1D, weight [in, out],
//    the other weight dim); a packed layer (ColwiseParallel::packed) StridedShard; everything else
//    Replicate; on a mesh of more dims, Replicate on all but the tensor-parallel one. What a module is
//    comes from how the graph uses its weight (src/graph/module_kinds.h), checked against its class;
//    a column-parallel projection split into fewer heads than ranks (GQA's KV heads) stays Replicate;
//    heads that cannot be spread are an error;
//  - every node marked by dtensor's own sharding propagation (the rules eager dispatch uses); a node
//    whose op has no rule runs on Replicate inputs, and the printout says so;
//  - before every node whose strategy needs an input elsewhere, a reshard subgraph of
//    _c10d_functional collectives (+ wait_tensor); the graph's outputs made Replicate;
//  - values given local shapes, size arguments of views and expands rewritten to local sizes, ops
//    that need more than the op on local shards (a vocabulary-sharded embedding) rewritten into the
//    local computation, and the state sharded: each rank reads only its part of every weight.
// The program's process groups are registered with c10d under their names (functional collectives
// find them there) for as long as the program lives.

#include "dtensor/graph/program.h"
#include "dtensor/parallel_style.h"

namespace dtensor::graph {

struct GraphParallelOptions {
  std::string tp_dim;  // the tensor-parallel mesh dim (by name) on a mesh of more than one dim
};

// `plan`'s entries are ColwiseParallel, RowwiseParallel (their layout fields are not used: the graph
// decides layouts by propagation) or SequenceParallel (the module's activations stay sharded along the
// sequence over the tensor-parallel dim: Megatron's sequence parallelism around norms, whose
// row-parallel producers then reduce-scatter and whose column-parallel readers all-gather). A path that
// matches no module of the program is an error that lists the module paths, unless the entry is
// optional (PlanEntry::optional, as hugging_face_plan makes them): then it is skipped and noted.
Program tensor_parallel_transform(Program program, const MeshPtr& mesh, const ParallelizePlan& plan,
                                  const GraphParallelOptions& options = {});

// The placements `plan` gives the program's parameters on `mesh` (the rule above on the tensor-parallel
// mesh dim, Replicate on the others), by FQN; parameters it does not name are not listed. For
// spmd_expand (spmd.h), which combines them with data parallelism on another mesh dim.
std::map<std::string, Placements> plan_placements(const Program& program, const DeviceMesh& mesh, const ParallelizePlan& plan,
                                                  const GraphParallelOptions& options = {});

// The paths of `plan`'s entries that match no module of the program (optional entries, which the
// transforms skip; tensor_parallel_transform notes them on the program it returns).
std::vector<std::string> unmatched_plan_entries(const Program& program, const ParallelizePlan& plan);

// Modules whose nodes keep every output of more than `sequence_dim` dims Shard(sequence_dim) over
// `mesh_dim` (where their rules allow it): a plan's SequenceParallel entries.
struct SequenceShardedModule {
  std::string module_pattern;  // a plan path ("model.layers.*.input_layernorm")
  int64_t mesh_dim = 0;
  int64_t sequence_dim = 1;
};
// `plan`'s SequenceParallel entries on the tensor-parallel mesh dim, for spmd_expand
// (SpmdPlacements::sequence_sharded); an entry that matches no module of the program is an error
// (skipped where optional).
std::vector<SequenceShardedModule> plan_sequence_parallel(const Program& program, const DeviceMesh& mesh, const ParallelizePlan& plan,
                                                          const GraphParallelOptions& options = {});

}  // namespace dtensor::graph
