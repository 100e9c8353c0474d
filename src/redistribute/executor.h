#pragma once
// Runs redistribution plans on local shards with the mesh's collectives.

#include <ATen/core/Tensor.h>

#include <functional>

#include "dtensor/redistribute_plan.h"
#include "dtensor/spec.h"

namespace dtensor::detail {

enum class Direction { Forward, Backward };

// Whether a plan may overwrite the local shard it is given. Borrowed: the caller keeps using it, so a
// step that works in place (the all-reduce) copies it first. Donated: nothing else can observe it
// (redistribute checks that before donating), so the step runs on it directly.
enum class Ownership { Borrowed, Donated };

// `local` with a conjugate or negative bit (a DTensor's conj() view keeps it on the shard) applied to
// its values: collectives move raw memory, which does not carry the bit.
inline at::Tensor with_views_resolved(const at::Tensor& local) {
  return local.is_conj() || local.is_neg() ? local.resolve_conj().resolve_neg() : local;
}

// The plan for this rank, from a per-thread cache (planning is pure, so a cache entry never goes stale).
const RedistributePlan& cached_plan(const DTensorSpec& from, const Placements& to);

// This rank's local shard after moving a tensor with spec `from` to placements `to` on the same mesh.
// Backward changes only Replicate -> Partial: a gradient flowing into a Partial input is the full
// replicated gradient for sum, the gradient divided by the group size for avg, and undefined for max/min.
at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& from, const Placements& to,
                              Direction direction = Direction::Forward, Ownership ownership = Ownership::Borrowed);

// redistribute_local (forward) with the plan's collective started and not waited for: `finish` waits
// for it, runs the plan's steps after it and returns the local shard. A plan that crosses ranks more
// than once, or by a collective other than an all-gather of Shard, a reduce-scatter or an all-reduce,
// runs to the end here instead: `done` is its result and `finish` is empty.
struct StartedRedistribution {
  at::Tensor done;
  std::function<at::Tensor()> finish;
};
StartedRedistribution start_redistribute_local(const at::Tensor& local, const DTensorSpec& from, const Placements& to);

// This rank's runs of `whole` (the tensor as a group along `mesh_dim` holds it) under `strided`, a
// StridedShard (its chunk of each block) or a HeadTailShard (its head and tail chunks) along that mesh dim.
at::Tensor strided_chunk(const at::Tensor& whole, const Placement& strided, const DeviceMesh& mesh, int64_t mesh_dim);

// A replicated value split into contributions whose `op` reduction over `mesh_dim` gives it back
// exactly (forward), or the gradient of such a split (backward).
at::Tensor partition_replicated(const at::Tensor& local, const DeviceMesh& mesh, int64_t mesh_dim, ReduceOp op,
                                Direction direction);

// `x` (the chunked dim leading) in a contiguous buffer of `rows` rows; rows past x's end are padding
// whose content is never read back. No copy when x already is that buffer.
at::Tensor padded_rows(const at::Tensor& x, int64_t rows);

// Runs one plan on this rank's local shard.
at::Tensor execute_plan(const RedistributePlan& plan, const at::Tensor& local, const DeviceMesh& mesh,
                        Direction direction, Ownership ownership);

}  // namespace dtensor::detail
