#pragma once
// Which ranks hold which part of a 1-d or 2-d DTensor, as a table, from layout math alone (no
// communication: any rank may call it, e.g. rank 0 to print it). For a [5, 6] tensor with
// placements (S(0),S(1)) on a 2x2 mesh:
//
//   DTensor shape=[5, 6], dtype=Float, placements=(S(0),S(1)), mesh=DeviceMesh([[0, 1], [2, 3]])
//             cols 0:3  cols 3:6
//   rows 0:3  0         1
//   rows 3:5  2         3
//
// Ranges are half-open (0:3 is indices 0, 1, 2), a cell lists every rank holding that block (several
// when replicated), and notes below say which ranks hold empty shards and which mesh dims are
// Partial (the ranks of a cell then hold contributions to reduce, not the values).

#include <ATen/core/Tensor.h>

#include <string>

#include "dtensor/spec.h"

namespace dtensor {

std::string visualize_sharding(const DTensorSpec& spec);
// Throws DTensorError when `dtensor` is not a DTensor or is not 1-d or 2-d.
std::string visualize_sharding(const at::Tensor& dtensor);

}  // namespace dtensor
