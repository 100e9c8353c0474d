#pragma once
// Helpers for the rules' graph forms (OpRule::graph_form): the call itself as graph ops.

#include <algorithm>
#include <vector>

#include "../eager_graph_form.h"
#include "dtensor/layout.h"
#include "dtensor/op_schema.h"
#include "optional_tensors.h"

namespace dtensor::rules {

// The call's arguments in a graph form, read as the call passes them: this rank's tensors where
// `is_tensor`, the call's own arguments elsewhere. `replaced` overrides arguments by index (a
// reduction's mode).
inline std::vector<FormArg> call_arguments(GraphFormBuilder& b, const std::vector<bool>& is_tensor,
                                           const std::vector<std::pair<size_t, c10::IValue>>& replaced = {}) {
  std::vector<FormArg> out;
  for (size_t i = 0; i < is_tensor.size(); ++i) out.emplace_back(is_tensor[i] ? FormArg(b.input(i)) : FormArg::as_called(i));
  for (const auto& [index, value] : replaced) out.at(index) = FormArg(value);
  return out;
}

// Which of the call's arguments are tensors.
inline std::vector<bool> tensor_arguments(const OpSchema& s) {
  std::vector<bool> out;
  for (size_t i = 0; i < s.args.size(); ++i) out.push_back(s.input_at_arg(i).has_value());
  return out;
}

// detail::all_reduce_over in a graph form: `v` reduced over each of `mesh_dims` in turn.
inline FormValue all_reduce_form(GraphFormBuilder& b, FormValue v, const std::vector<int64_t>& mesh_dims, ReduceOp op) {
  for (int64_t m : mesh_dims) v = b.all_reduce(v, op, m);
  return v;
}

// constant_pad_nd's padding that puts `part` of a `global`-shaped tensor in its place among zeros: the
// last dim first, (before, after) each.
inline std::vector<int64_t> padding_to_whole(const LocalLayout& part, const Shape& global) {
  std::vector<int64_t> pad;
  for (size_t d = global.size(); d-- > 0;) pad.insert(pad.end(), {part.offset[d], global[d] - part.offset[d] - part.shape[d]});
  return pad;
}

// The whole tensor on every rank, from this rank's part (`part` of `global`, sharded over `mesh_dims`):
// each part padded with zeros to the whole shape at its offset, then summed over the mesh dims, which
// adds only zeros to each element. An all-gather written with what graph forms have.
inline FormValue whole_tensor_form(GraphFormBuilder& b, FormValue v, const LocalLayout& part, const Shape& global,
                                   const std::vector<int64_t>& mesh_dims) {
  return all_reduce_form(b, b.op("aten::constant_pad_nd", {v, padding_to_whole(part, global)}, "placed"), mesh_dims, ReduceOp::Sum);
}

// The op itself on this rank's tensors: for kernels that only do something else in some cases (an
// empty shard), as a form in the cases where they do not.
inline GraphForm the_op_itself(const OpSchema& s) {
  return [op = s.op_name(), is_tensor = tensor_arguments(s)](GraphFormBuilder& b) {
    return std::vector<FormValue>{b.op(op, call_arguments(b, is_tensor), "local")};
  };
}

// A local kernel written once, as its graph form: eager dispatch runs the form's ops through the
// dispatcher (run_graph_form), graph programs get the ops themselves. For kernels off the hot path
// (empty shards, synchronised statistics, histograms) one computation is worth the boxed calls.
// `form` returns one value per output the call asks for (output_mask); the kernel returns undefined
// tensors for the others, and graph programs get the form only where every output is asked for (a
// graph node has a value for each).
struct FormedKernel {
  LocalKernelRule kernel;
  GraphFormRule graph_form;
};

inline FormedKernel written_as_form(GraphFormRule form) {
  LocalKernelRule kernel = [form](const OpSchema& s, const PlacementStrategy& chosen) -> LocalKernel {
    GraphForm written = form(s, chosen);
    if (!written) return {};
    return [written, mesh = s.mesh, mask = asked_outputs(s)](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
      detail::run_graph_form(written, *mesh, op, stack);
      const size_t asked = static_cast<size_t>(std::count(mask.begin(), mask.end(), true));
      if (asked == mask.size()) return;
      std::vector<at::Tensor> results;
      for (const c10::IValue& v : torch::jit::pop(stack, asked)) results.push_back(v.toTensor());
      for (size_t k = 0, next = 0; k < mask.size(); ++k) torch::jit::push(stack, mask[k] ? results[next++] : at::Tensor());
    };
  };
  GraphFormRule graph_form = [form](const OpSchema& s, const PlacementStrategy& chosen) -> GraphForm {
    const std::vector<bool> mask = asked_outputs(s);
    return std::find(mask.begin(), mask.end(), false) == mask.end() ? form(s, chosen) : GraphForm{};
  };
  return {std::move(kernel), std::move(graph_form)};
}

// Zeros shaped like this rank's part of every output the call asks for: the op's value on a shard with
// no elements (a sum over nothing), where the CPU kernel would fail on it.
inline GraphForm zeros_of_asked_outputs(const OpSchema& s, const PlacementStrategy& chosen) {
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

// The kernel and form of ops that are zeros on an empty shard of input `i` and themselves otherwise.
inline FormedKernel zero_outputs_when_empty(size_t i) {
  return written_as_form([i](const OpSchema& s, const PlacementStrategy& chosen) {
    return empty_here(s, chosen, i) ? zeros_of_asked_outputs(s, chosen) : GraphForm{};
  });
}

}  // namespace dtensor::rules
