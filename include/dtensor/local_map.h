#pragma once
// local_map (after PyTorch's torch.distributed.tensor.experimental.local_map): run a function written
// for local tensors (a hand-written kernel, a per-shard computation) on DTensors. The function sees
// each rank's shards and returns this rank's shards of its results.

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/placement.h"

namespace dtensor {

using LocalFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

using PlacementsPerInput = std::vector<std::optional<Placements>>;

// Wraps `fn` as a function of DTensors. The returned function, called with DTensors (and plain
// tensors, which pass to fn as they are):
//  - checks every DTensor argument against in_placements[i] when in_placements is given (an entry
//    for a DTensor must be set); a mismatch is a DTensorError, or with redistribute_inputs a
//    redistribution to in_placements[i];
//  - calls fn on the local shards;
//  - wraps fn's i-th output as a DTensor with out_placements[i]. Global shapes are exact even for
//    uneven shards: ranks exchange the sizes of sharded dims (one small all-gather per Shard mesh dim
//    per output); PyTorch assumes even shards instead.
// Every DTensor argument must be on `mesh` (default: the first DTensor argument's mesh). Called with
// no DTensor argument, it returns fn's outputs as they are.
//
// Differentiable: gradients flow through fn (to_local / from_local). in_grad_placements[i] says how
// the gradient fn gives local input i is laid out (default: like the input). A replicated input
// whose local gradients differ by rank, as a weight multiplied by sharded activations, needs Partial.
LocalFunction local_map(LocalFunction fn, std::vector<Placements> out_placements,
                        std::optional<PlacementsPerInput> in_placements = std::nullopt, bool redistribute_inputs = false,
                        MeshPtr mesh = nullptr, std::optional<PlacementsPerInput> in_grad_placements = std::nullopt);

}  // namespace dtensor
