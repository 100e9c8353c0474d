#pragma once
// The dims a squeeze removes: those asked for (all when none are) that are 1 in the global shape. A
// sharded dim can be 1 in a local shard only, so a squeeze of local shards must be told these dims:
// the squeeze rule's local kernel (view.cpp) and its graph form (src/graph/lowerings.cpp) both are.

#include <algorithm>
#include <vector>

#include "rule_helpers.h"

namespace dtensor::rules {

// `asked`: the squeeze's dim or dims argument, or nullptr for the overload without one.
inline std::vector<int64_t> globally_squeezed_dims(const Shape& global_shape, const c10::IValue* asked_arg) {
  const auto ndim = static_cast<int64_t>(global_shape.size());
  std::vector<int64_t> asked;
  if (!asked_arg) {
    for (int64_t d = 0; d < ndim; ++d) asked.push_back(d);
  } else if (asked_arg->isInt()) {
    asked.push_back(wrap_dim(asked_arg->toInt(), ndim));
  } else {
    for (int64_t d : asked_arg->toIntVector()) asked.push_back(wrap_dim(d, ndim));
  }
  std::vector<int64_t> out;
  for (int64_t d : asked)
    if (d < ndim && global_shape[d] == 1 && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace dtensor::rules
