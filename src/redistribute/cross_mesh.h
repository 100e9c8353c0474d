#pragma once
// Moving a tensor from one mesh to another whose ranks differ (overlapping or disjoint): each rank of
// the target gets exactly the index ranges its shard needs from the ranks of the source holding them,
// planned with the checkpoint loader's layout math (pieces_of, intersect) and moved by one all-to-all
// over the union of both meshes' ranks (a rank's overlap with itself is a local copy).

#include <ATen/core/Tensor.h>

#include "dtensor/spec.h"

namespace dtensor::detail {

// This rank's local shard for `to` given its local shard for `from` (neither Partial). Every rank of
// both meshes must call it; ranks outside `to` get an empty shard.
at::Tensor move_across_meshes(const at::Tensor& local, const DTensorSpec& from, const DTensorSpec& to);

}  // namespace dtensor::detail
