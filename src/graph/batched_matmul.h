#pragma once
// Batched matmuls over merged dims, lifted back to 4-d. Core ATen graphs (and every joint graph:
// autograd decomposes matmul) compute attention's q @ k^T and p @ v as
//     view(q [B, H, T, D] -> [B*H, T, D]) ... bmm ... view([B*H, T, T] -> [B, H, T, T])
// Merging B with a head-sharded H is no shard of the merged dim (its rows interleave batches), so
// sharding propagation must gather the heads there; PyTorch's DTensor invented _StridedShard for
// this. A graph can instead say what it means: each such bmm, its merging views (directly or through
// a transpose of the last two dims) and its splitting view become one aten::matmul on the 4-d
// values, which keeps the heads sharded (matmul's rule batches over B and H) and costs nothing at
// run time (matmul does the same view + bmm on each rank's local heads).

#include "dtensor/graph/ir.h"

namespace dtensor::graph::detail {

// Rewrites every bmm of `graph` that fits the pattern above (static sizes only); returns how many.
int lift_merged_batch_matmuls(Graph& graph);

}  // namespace dtensor::graph::detail
