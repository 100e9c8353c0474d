#pragma once
// Sharding propagation: from a call's input specs to the chosen strategy, cached per thread.

#include <ATen/core/dispatch/Dispatcher.h>

#include "dtensor/op_schema.h"
#include "for_graph.h"

namespace dtensor::detail {

// A decision as the cache keeps it: with, per output, the input whose placements and meta the output's
// equal (-1: none), so that wrapping the output can share that input's spec instead of making one.
struct CachedDecision {
  OutputSharding sharding;
  std::vector<int> output_spec_source;
};

// How the call runs. Strategies needing no redistribution win; otherwise the one whose input moves
// cost least (bytes moved, by the redistribution planner's model). Cached by OpSchema: the op, the
// input specs and the non-tensor arguments that can change the outcome.
const CachedDecision& propagate(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                const std::vector<TensorInput>& inputs, const MeshPtr& mesh);

// Every combination of one single-mesh-dim strategy per mesh dim: what propagation makes of a DimRule.
// For mesh rules that start from per-dim strategies and keep some of the combinations.
OpStrategy expand_dim_strategies(const std::vector<DimStrategy>& per_dim, int64_t mesh_ndim, size_t n_out, size_t n_in);

// Makes every thread's cache drop its entries before its next lookup (after a rule changes).
void invalidate_propagation_caches();

}  // namespace dtensor::detail
