#pragma once
// Helpers for ops whose tensors may be absent: arguments that may be None (Tensor?: a bias, running
// statistics, per-sample weights) and outputs an `output_mask` argument leaves out (the backward ops
// of convolution and the norms return undefined tensors for the gradients nobody asked for). Also the
// local kernel for ranks whose shard is empty, which several CPU kernels reject or miscompute.

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
  return numel(local_part(s, s.input(i).meta.shape, chosen.inputs[i]).shape) == 0;
}

// A local kernel returning zeros shaped like this rank's part of every asked output: the op's value
// on a shard with no elements (a sum over nothing), where the CPU kernel would fail on it.
inline LocalKernel zero_outputs(const OpSchema& s, const PlacementStrategy& chosen) {
  std::vector<Shape> shapes;
  std::vector<c10::ScalarType> dtypes;
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    shapes.push_back(local_output_shape(s, chosen, k));
    dtypes.push_back(s.outputs[k].dtype);
  }
  return [mask = asked_outputs(s), shapes, dtypes](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const at::Device device = args[0].toTensor().device();  // every such op's first argument is a tensor
    std::vector<at::Tensor> results;
    for (size_t k = 0, next = 0; k < mask.size(); ++k) {
      results.push_back(mask[k] ? at::zeros(shapes[next], at::TensorOptions().dtype(dtypes[next]).device(device))
                                : at::Tensor());
      next += mask[k] ? 1 : 0;
    }
    push_asked(stack, mask, results);
  };
}

// zero_outputs as graph ops, where the call asks for every output (a graph node has a value for each,
// so a form leaving one out has no place for its None); empty otherwise, and the kernel stays.
inline GraphForm zero_outputs_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const std::vector<bool> mask = asked_outputs(s);
  if (std::find(mask.begin(), mask.end(), false) != mask.end()) return {};
  std::vector<Shape> shapes;
  std::vector<c10::ScalarType> dtypes;
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    shapes.push_back(local_output_shape(s, chosen, k));
    dtypes.push_back(s.outputs[k].dtype);
  }
  return [shapes, dtypes](GraphFormBuilder& b) {
    std::vector<FormValue> out;  // every such op's first argument is a tensor: the zeros take its device
    for (size_t k = 0; k < shapes.size(); ++k) out.push_back(b.op("aten::new_zeros", {b.input(0), shapes[k], c10::IValue(dtypes[k])}, "zeros"));
    return out;
  };
}

// For kernels that are zero_outputs on an empty shard of input `i` and nothing otherwise.
inline GraphFormRule zero_outputs_form_when_empty(size_t i) {
  return [i](const OpSchema& s, const PlacementStrategy& chosen) -> GraphForm {
    return empty_here(s, chosen, i) ? zero_outputs_form(s, chosen) : GraphForm{};
  };
}

}  // namespace dtensor::rules
