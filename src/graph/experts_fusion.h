#pragma once
// Experts of a mixture of experts, as exported programs hold them, rewritten into dtensor's experts ops
// (dtensor::moe_experts and its backward, src/sharding/rules/experts.cpp) wherever their weights are
// spread over a mesh dim (Shard(0) on their experts), so that expert parallelism is a strategy the
// choice can take: the tokens' exchange by all-to-all, or transformers' assignments to each rank's own
// experts added up.
//
// A site is found from its weights: two 3-d parameters, [E, 2I, H] (gate and up, gate rows first) and
// [E, H, I], whose experts one index selects (transformers' "batched_mm" experts). From there the
// forward is the nodes between the hidden states [T, H], the routing (chosen experts and weights,
// [T, k]) and the weighted sum [T, H]; in a joint program the backward is the nodes that read what the
// forward computed, up to the gradients of the hidden states, the routing weights and both weights.
// Neither is trusted for its shape alone: before rewriting, both run on random inputs and must equal
// the experts ops (the gradients chosen among the backward's values by that test), else the site is
// refused, naming its weights.

#include "dtensor/graph/program.h"

namespace dtensor::graph::detail {

void fuse_spread_experts(Program& program);

}  // namespace dtensor::graph::detail
