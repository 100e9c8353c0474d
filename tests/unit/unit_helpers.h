#pragma once
// Helpers shared by the single-process unit tests.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dtensor/layout.h"

namespace dtensor::unit {

// Every coordinate of a mesh, in row-major order.
inline std::vector<Shape> all_coordinates(const Shape& mesh) {
  std::vector<Shape> out = {{}};
  for (int64_t size : mesh) {
    std::vector<Shape> next;
    for (const auto& prefix : out)
      for (int64_t i = 0; i < size; ++i) {
        Shape c = prefix;
        c.push_back(i);
        next.push_back(c);
      }
    out = next;
  }
  return out;
}

}  // namespace dtensor::unit
