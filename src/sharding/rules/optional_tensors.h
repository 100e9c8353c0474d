#pragma once
// Helpers for ops whose tensors may be absent: arguments that may be None (Tensor?: a bias, running
// statistics, per-sample weights) and outputs an `output_mask` argument leaves out (the backward ops
// of convolution and the norms return undefined tensors for the gradients nobody asked for).

#include <ATen/ATen.h>
#include <ATen/core/stack.h>

#include <algorithm>

#include "rule_helpers.h"

namespace dtensor::rules {

// One placement per tensor input of the call, chosen by the input's argument index: a rule names
// every argument the op may take, and absent ones simply have no input.
template <typename ByArgument>
Placements by_argument(const OpSchema& s, ByArgument&& placement) {
  Placements out;
  for (const auto& in : s.inputs) out.push_back(placement(in.arg));
  return out;
}

// The argument's value by name (the op's schema must have it).
inline const c10::IValue& argument(const OpSchema& s, const char* name) {
  return s.args[*s.schema.argumentIndexWithName(name)];
}

// Which of the op's outputs the call returns: output_mask's entries, or all of them.
inline std::vector<bool> asked_outputs(const OpSchema& s) {
  if (!s.schema.argumentIndexWithName("output_mask")) return std::vector<bool>(s.schema.returns().size(), true);
  return argument(s, "output_mask").toBoolList().vec();
}

// The placements of the returned outputs, from one placement per possible output.
inline Placements asked(const OpSchema& s, const Placements& all) {
  const std::vector<bool> mask = asked_outputs(s);
  Placements out;
  for (size_t k = 0; k < all.size(); ++k)
    if (mask[k]) out.push_back(all[k]);
  return out;
}

// Pushes one result per possible output: `results[k]` where asked, an undefined tensor elsewhere.
inline void push_asked(torch::jit::Stack& stack, const std::vector<bool>& mask, const std::vector<at::Tensor>& results) {
  for (size_t k = 0; k < mask.size(); ++k) torch::jit::push(stack, mask[k] ? results[k] : at::Tensor());
}

// Whether this rank's part of input `i` holds no elements under `chosen` (uneven shards: 5 channels
// over 4 ranks leave one rank none).
inline bool empty_here(const OpSchema& s, const PlacementStrategy& chosen, size_t i) {
  const Shape coordinate = s.mesh->coordinate().value_or(Shape(s.mesh->ndim(), 0));
  return numel(local_shape(s.input(i).meta.shape, s.mesh->shape(), coordinate, chosen.inputs[i])) == 0;  // any sharding, multi-run too
}

}  // namespace dtensor::rules
