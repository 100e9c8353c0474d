#pragma once
// Context parallelism for the CPU flash attention kernels (rules/attention.cpp registers them): with
// q, k and v all sharded along the sequence over a mesh dim (Shard, or HeadTailShard: load balanced), and
// neither mask nor dropout, the kernels
// run by ring or all-to-all (kernels/context_attention.h) and every tensor stays sharded so. The
// method is set_context_parallel_attention's, or on Auto the one that moves fewer bytes over that mesh
// dim (all-to-all only where the heads divide by its ranks); the strategy's kernel cost is that
// method's traffic, so that propagation takes it where the inputs arrive sharded along the sequence
// and keeps replicated attention replicated.

#include <optional>
#include <vector>

#include "dtensor/op_schema.h"

namespace dtensor::rules {

// Where the tensors sit among the kernel's arguments.
struct SequenceRoles {
  size_t key, value, mask;  // the query is argument 0 (in backward, the output's gradient, shaped like it)
  int ring_passes;          // how often the ring sends the keys and values around: 1, or 2 in backward (their gradients)
};

// Whether the call may run on the sequence shards: no dropout, no mask, one sequence.
bool sequence_applies(const OpSchema& s, const SequenceRoles& roles);
// Every tensor sharded along the sequence, on one mesh dim (costed over the whole mesh).
DimStrategy sequence_strategy(const OpSchema& s);
// The per-dim strategies over the whole mesh, less the combinations the kernels cannot run (the
// sequence sharded on two mesh dims, or the queries' sharded again on another dim than the keys'), the
// sequence strategy costed by the method it runs.
OpStrategy sequence_over_the_mesh(const OpSchema& s, const SequenceRoles& roles, const std::vector<DimStrategy>& per_dim);
// The mesh dim a chosen strategy shards the keys' sequence over (Shard or HeadTailShard), if any: where
// the sequence kernel runs.
std::optional<int64_t> sequence_dim(const OpSchema& s, const SequenceRoles& roles, const PlacementStrategy& chosen);
// Whether the chosen strategy's sequence along `mesh_dim` is load balanced: a HeadTailShard, or a Shard
// under set_context_parallel_load_balance (the data's order, as PyTorch's context_parallel makes it).
bool load_balanced_sequence(const PlacementStrategy& chosen, int64_t mesh_dim);
// The local kernel of the forward or backward kernel on the sequence shards along `mesh_dim`.
LocalKernel sequence_forward_kernel(const OpSchema& s, const SequenceRoles& roles, const PlacementStrategy& chosen, int64_t mesh_dim);
LocalKernel sequence_backward_kernel(const OpSchema& s, const SequenceRoles& roles, const PlacementStrategy& chosen, int64_t mesh_dim);
// Their graph forms (sequence_forms.cpp), for the strategy `chosen`: empty where there is none.
GraphForm sequence_forward_form(const OpSchema& s, const PlacementStrategy& chosen, int64_t mesh_dim);
GraphForm sequence_backward_form(const OpSchema& s, const PlacementStrategy& chosen, int64_t mesh_dim);

}  // namespace dtensor::rules
