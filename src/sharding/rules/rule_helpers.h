#pragma once
// Small helpers shared by the rule files.

#include "dtensor/op_schema.h"

namespace dtensor::rules {

// Normalises a possibly negative dim against `ndim` (0-d tensors take dim 0 / -1).
inline int64_t wrap_dim(int64_t dim, int64_t ndim) {
  const int64_t n = ndim == 0 ? 1 : ndim;
  return dim < 0 ? dim + n : dim;
}

// One strategy for every input and output: all Replicate.
inline DimStrategy all_replicate(const OpSchema& s) {
  return DimStrategy{Placements(s.outputs.size(), Replicate()), Placements(s.inputs.size(), Replicate())};
}

}  // namespace dtensor::rules
