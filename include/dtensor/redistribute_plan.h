#pragma once
// The redistribution planner: a pure function from (global shape, mesh, this rank's coordinate,
// current placements, target placements) to an ordered list of per-mesh-dim steps, each with the
// collective it needs and the bytes it moves per rank. No communication and no torch: it can be
// unit-tested, printed for a user ("why did this all-gather happen?") and run for huge meshes.

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/layout.h"
#include "dtensor/placement.h"

namespace dtensor {

enum class StepKind : std::uint8_t {
  AllGather,         // S(d) or SS(d,k) -> R
  AllToAll,          // S(i) -> S(j)
  AllReduce,         // P -> R
  ReduceScatter,     // P -> S(d)
  LocalChunk,        // R -> S(d) or SS(d,k): keep this rank's chunk(s), no communication
  LocalPartition,    // R -> P: split a replicated value into contributions, no communication
  LocalPad,          // S(d) -> P(sum): this rank's shard in zeros of the whole, no communication
};
std::string to_string(StepKind kind);
bool is_collective(StepKind kind);

struct RedistributeStep {
  int64_t mesh_dim;
  Placement from;
  Placement to;
  StepKind kind;
  // The part of the global tensor that this mesh dim's process group holds together when the step
  // runs (the global shape cut by the other mesh dims' shards): what uneven padding and bytes are
  // based on.
  Shape logical_shape;
  int64_t bytes_per_rank;  // bytes this rank receives (a ring's traffic); 0 for local steps

  std::string str() const;  // "all-gather on dim 0 (3.1 MB/rank)"
  // A LocalPad step's padding of this rank's shard (of `ndim` dims) to the group's whole, at mesh
  // coordinate `index` along mesh_dim of `group_size` ranks: constant_pad_nd's (before, after) pairs,
  // from the last dim backwards, up to the sharded dim.
  std::vector<int64_t> pad_to_whole(int64_t ndim, int64_t group_size, int64_t index) const;
};

struct RedistributePlan {
  Placements src;
  Placements dst;
  std::vector<RedistributeStep> steps;

  int64_t total_bytes_per_rank() const;
  bool needs_communication() const;
  // "S(0),R -> R,S(1): all-gather on dim 0 (3.1 MB/rank), then local chunk on dim 1"
  std::string str() const;
};

// Plans src -> dst. Both must be validated placements (validate_placements) for the tensor. Changing
// between different Partial ops, from Shard to Partial, and to or from a StridedShard (other than
// from or to Replicate) goes through Replicate.
RedistributePlan plan_redistribute(const Shape& global_shape, int64_t element_size, const Shape& mesh_shape,
                                   const Shape& coordinate, const Placements& src, const Placements& dst);

// Human-readable byte count: "512 B", "3.1 MB".
std::string format_bytes(double bytes);

}  // namespace dtensor
