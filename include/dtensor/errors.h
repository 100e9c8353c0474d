#pragma once
// One exception type for every user-facing error, so callers can tell dtensor's complaints (bad
// placements, mismatched meshes, a timed-out collective) from LibTorch's own.

#include <stdexcept>
#include <string>

namespace dtensor {

class DTensorError : public std::runtime_error {
 public:
  explicit DTensorError(const std::string& what) : std::runtime_error("dtensor: " + what) {}
};

}  // namespace dtensor
