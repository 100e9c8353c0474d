#pragma once
// Helpers for the rules' graph forms (OpRule::graph_form): the call itself as graph ops.

#include <vector>

#include "dtensor/op_schema.h"

namespace dtensor::rules {

// The call's arguments in a graph form, read as the call passes them: this rank's tensors where
// `is_tensor`, the call's values elsewhere. `replaced` overrides arguments by index (a reduction's mode).
inline std::vector<FormArg> call_arguments(GraphFormBuilder& b, const std::vector<bool>& is_tensor,
                                           const std::vector<std::pair<size_t, c10::IValue>>& replaced = {}) {
  std::vector<FormArg> out;
  for (size_t i = 0; i < is_tensor.size(); ++i) out.emplace_back(is_tensor[i] ? FormArg(b.input(i)) : FormArg(b.argument(i)));
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

// The op itself on this rank's tensors: for kernels that only do something else in some cases (an
// empty shard), as a form in the cases where they do not.
inline GraphForm the_op_itself(const OpSchema& s) {
  return [op = s.op_name(), is_tensor = tensor_arguments(s)](GraphFormBuilder& b) {
    return std::vector<FormValue>{b.op(op, call_arguments(b, is_tensor), "local")};
  };
}

}  // namespace dtensor::rules
