#pragma once
// Where an attention mask (or bias) goes when attention is sharded: shared by the CPU kernels'
// rules (attention.cpp) and the CUDA fused kernels' (fused_attention.cpp).

#include "dtensor/op_schema.h"

namespace dtensor::rules {

// The mask broadcasts to [batch, heads, queries, keys] from the right: the placement of its dim under
// `dim` of the query (argument 0, or a gradient shaped like it) when that dim is sharded, or
// Replicate where it broadcasts (size 1 or absent). `input` indexes OpSchema::inputs.
Placement attention_mask_placement(const OpSchema& s, size_t input, int64_t dim);

}  // namespace dtensor::rules
