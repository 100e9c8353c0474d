#include "dtensor/spec.h"

namespace dtensor {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Shape DTensorSpec::local_shape() const {
  if (!mesh->coordinate()) return Shape{0};
  return dtensor::local_shape(meta.shape, mesh->shape(), *mesh->coordinate(), placements);
}

bool DTensorSpec::has_partial() const {
  for (const auto& p : placements)
    if (p.is_partial()) return true;
  return false;
}

std::string DTensorSpec::str() const {
  return "shape=" + shape_str(meta.shape) + ", dtype=" + c10::toString(meta.dtype) + ", placements=(" +
         to_string(placements) + "), mesh=" + mesh->str();
}

}  // namespace dtensor
