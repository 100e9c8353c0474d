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

// The mesh dims along which `placements` shard tensor dim `dim` (a local kernel combines its partial
// results over exactly these).
inline std::vector<int64_t> mesh_dims_sharding(const Placements& placements, int64_t dim) {
  std::vector<int64_t> out;
  for (int64_t m = 0; m < static_cast<int64_t>(placements.size()); ++m)
    if (placements[m].is_shard(dim)) out.push_back(m);
  return out;
}

// This rank's part (shape and global offset) of a tensor of `global_shape` laid out as `placements`;
// what a local kernel works on. Ranks outside the mesh never run one and get the first coordinate's.
inline LocalLayout local_part(const OpSchema& s, const Shape& global_shape, const Placements& placements) {
  const Shape coordinate = s.mesh->coordinate().value_or(Shape(s.mesh->ndim(), 0));
  return local_layout(global_shape, s.mesh->shape(), coordinate, placements);
}

}  // namespace dtensor::rules
