#pragma once
// Backward computations a joint graph spells out op by op, folded back into ATen's fused kernels.
// torch.export's _export_forward_backward runs the core ATen decompositions, which write layer norm's,
// softmax's and GELU's backward as small pointwise ops and reductions (a layer norm's input gradient
// alone is 11 nodes), each a pass over the activations and a dispatch; the fused kernels make one
// pass. Each fold matches the decomposition's exact form (torch/_decomp/decompositions.py) and
// replaces it by native_layer_norm_backward, _softmax_backward_data or gelu_backward, which dtensor's
// sharding rules cover like any op; whatever differs from the form is left as it is.

#include "dtensor/graph/ir.h"

namespace dtensor::graph::detail {

struct FoldedBackward {
  int layer_norm = 0, softmax = 0, gelu = 0;
};

// Folds every match in `graph` (global metas: run before marking) and says how many of each.
FoldedBackward fold_decomposed_backward(Graph& graph);

}  // namespace dtensor::graph::detail
