#pragma once
// DTensorSpec: everything about a DTensor except its local data — the mesh, one placement per mesh
// dim, and the global tensor's shape, stride and dtype.

#include <c10/core/ScalarType.h>

#include <string>

#include "dtensor/device_mesh.h"
#include "dtensor/layout.h"
#include "dtensor/placement.h"

namespace dtensor {

struct TensorMeta {
  Shape shape;
  Shape stride;
  c10::ScalarType dtype = c10::ScalarType::Float;

  bool operator==(const TensorMeta& o) const { return shape == o.shape && stride == o.stride && dtype == o.dtype; }
};

struct DTensorSpec {
  MeshPtr mesh;
  Placements placements;
  TensorMeta meta;

  int64_t ndim() const { return static_cast<int64_t>(meta.shape.size()); }
  // This rank's local shard shape (empty-sized on ranks outside the mesh).
  Shape local_shape() const;
  bool has_partial() const;
  // The same spec with other placements.
  DTensorSpec with_placements(Placements p) const { return DTensorSpec{mesh, std::move(p), meta}; }

  bool operator==(const DTensorSpec& o) const {
    return same_mesh(mesh, o.mesh) && placements == o.placements && meta == o.meta;
  }
  // "shape=[8, 6], dtype=Float, placements=(S(0),R), mesh=DeviceMesh([[0, 1], [2, 3]])"
  std::string str() const;
};

std::string shape_str(const Shape& shape);

}  // namespace dtensor
