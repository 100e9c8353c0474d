#pragma once
// Small helpers shared by the rule files.

#include <ATen/ATen.h>

#include <string>

#include "dtensor/errors.h"
#include "dtensor/layout.h"
#include "dtensor/op_schema.h"

namespace dtensor::rules {

// Normalises a possibly negative dim against `ndim` (0-d tensors take dim 0 / -1).
inline int64_t wrap_dim(int64_t dim, int64_t ndim) {
  const int64_t n = ndim == 0 ? 1 : ndim;
  return dim < 0 ? dim + n : dim;
}

// The op's `dim` argument, normalised against `ndim`.
inline int64_t dim_arg(const OpSchema& s, int64_t ndim) {
  const auto& args = s.schema.arguments();
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].name() == "dim") return wrap_dim(s.args[i].toInt(), ndim);
  throw DTensorError(s.op_name() + " has no dim argument");
}

// Partial reductions that commute with an op that only moves, copies or zero-fills values.
inline const std::vector<ReduceOp> kMovesValues = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

// Output metas (OutputMetaRule) of an op whose one result is shaped like its `self` argument, for ops
// without a Meta kernel that fail on stand-in zeros (a singular matrix, invalid indices).
inline std::vector<TensorMeta> like_self(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const at::Tensor& self = args[*op.schema().argumentIndexWithName("self")].toTensor();
  return {TensorMeta{self.sizes().vec(), contiguous_strides(self.sizes().vec()), self.scalar_type()}};
}

// One strategy for every input and output: all Replicate.
inline DimStrategy all_replicate(const OpSchema& s) {
  return DimStrategy{Placements(s.outputs.size(), Replicate()), Placements(s.inputs.size(), Replicate())};
}

// The mesh dims along which `placements` shard (plain or strided): where a local kernel's partial
// answers must meet.
inline std::vector<int64_t> sharding_mesh_dims(const Placements& placements) {
  std::vector<int64_t> dims;
  for (int64_t m = 0; m < static_cast<int64_t>(placements.size()); ++m)
    if (placements[m].is_sharding()) dims.push_back(m);
  return dims;
}

// The Partial reductions a linear op (sums, scalings, products) maps to the same Partial output.
// Sum always; Avg only when every tensor is floating: an integer average truncates, so the average of
// 3 * x_r is not 3 * (the average of x_r) when the contributions do not divide evenly. None when
// values become integers (sum(x, dtype=long) truncates each contribution) or are boolean.
// `value_inputs`: the inputs whose values the op combines (default: all; not index tensors).
inline std::vector<ReduceOp> linear_reduce_ops(const OpSchema& s, std::vector<size_t> value_inputs = {}) {
  if (value_inputs.empty())
    for (size_t i = 0; i < s.inputs.size(); ++i) value_inputs.push_back(i);
  bool floating_in = true, floating_out = true, any_floating_in = false;
  for (size_t i : value_inputs) {
    const auto dtype = s.input(i).meta.dtype;
    if (dtype == c10::ScalarType::Bool) return {};
    floating_in = floating_in && c10::isFloatingType(dtype);
    any_floating_in = any_floating_in || c10::isFloatingType(dtype);
  }
  for (const auto& out : s.outputs) {
    if (out.dtype == c10::ScalarType::Bool || (any_floating_in && !c10::isFloatingType(out.dtype))) return {};
    floating_out = floating_out && c10::isFloatingType(out.dtype);
  }
  if (floating_in && floating_out) return {ReduceOp::Sum, ReduceOp::Avg};
  return {ReduceOp::Sum};
}

// Raises DTensorError(`message`) unless `ok` (a boolean 0-d tensor) holds. On the CPU it reads the
// flag (no stall there); on an accelerator it asserts on the device instead, so the hot path does not
// wait for the host: the error then surfaces asynchronously, as single-device CUDA kernels report it.
inline void check_on_device(const at::Tensor& ok, const std::string& message) {
  if (ok.device().is_cpu()) {
    if (!ok.item<bool>()) throw DTensorError(message);
    return;
  }
  at::_assert_async(ok, message);
}

// The mesh dims along which `placements` shard tensor dim `dim` (a local kernel combines its partial
// results over exactly these).
inline std::vector<int64_t> mesh_dims_sharding(const Placements& placements, int64_t dim) {
  std::vector<int64_t> out;
  for (int64_t m = 0; m < static_cast<int64_t>(placements.size()); ++m)
    if (placements[m].is_sharding() && placements[m].dim() == dim) out.push_back(m);
  return out;
}

// This rank's part (shape and global offset) of a tensor of `global_shape` laid out as `placements`;
// what a local kernel works on. Ranks outside the mesh never run one and get the first coordinate's.
inline LocalLayout local_part(const OpSchema& s, const Shape& global_shape, const Placements& placements) {
  const Shape coordinate = s.mesh->coordinate().value_or(Shape(s.mesh->ndim(), 0));
  return local_layout(global_shape, s.mesh->shape(), coordinate, placements);
}

}  // namespace dtensor::rules
