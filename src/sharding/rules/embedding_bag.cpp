// Bags of embeddings: _embedding_bag (what EmbeddingBag and functional::embedding_bag reach when the
// table needs a gradient), _embedding_bag_forward_only (when it does not), and the gradients
// _embedding_bag_backward and _embedding_bag_per_sample_weights_backward. A table [V, D]; 1-d indices
// cut into B bags by offsets (functional::embedding_bag flattens 2-d input into that); each bag's
// rows summed, averaged or max-reduced, optionally weighted per index (sum mode), padding_idx rows
// left out. Outputs: (output [B, D], offset2bag, bag_size, max_indices); the last three describe
// the bags for the backward op.
//
// - column-sharded table (Shard(1)) -> output Shard(1) (and max_indices, [B, D] in max mode);
// - row-sharded table (Shard(0): the vocabulary over ranks, uneven V allowed), sum and mean modes:
//   each rank sums the rows it holds, every other index weighted 0 and a mean's indices weighted
//   1 / (bag size), which every rank knows from the indices: the output is Partial(sum), and its
//   gradient is computed for this rank's rows only. Max mode is not offered this way (the table is
//   gathered or column-sharded instead): the max over ranks would be a Partial(max) with -inf for
//   rows held elsewhere, but the arg max that backward needs would come from whichever rank holds the
//   maximum, and no placement expresses that;
// - sum and mean are linear in the table and in the per-sample weights: a Partial one stays Partial.
// Indices, offsets and per-sample weights are Replicate: offsets point into the whole index list.

#include <ATen/ATen.h>
#include <ATen/core/stack.h>

#include "../registry.h"
#include "dtensor/errors.h"
#include "form_helpers.h"
#include "optional_tensors.h"
#include "rule_helpers.h"
#include "vocab_rows.h"

namespace dtensor::rules {
namespace {

enum Mode : int64_t { kSum = 0, kMean = 1, kMax = 2 };

Mode mode_of(const OpSchema& s) { return static_cast<Mode>(argument(s, "mode").toInt()); }

// The bag of every index: the last offset at or before its position (empty bags repeat an offset; with
// include_last_offset the final offset is the index count, past every position).
// (The positions 0, 1, ... are a cumulative sum of ones made like the offsets, so on their device.)
FormValue bag_of_each_index(GraphFormBuilder& b, FormValue offsets, int64_t count) {
  const FormValue ones = b.op("aten::new_ones", {offsets, std::vector<int64_t>{count}}, "ones");
  const FormValue positions = b.op("aten::sub.Scalar", {b.op("aten::cumsum", {ones, int64_t{0}}, "counted"), int64_t{1}}, "positions");
  const FormValue after = b.op("aten::searchsorted.Tensor", {offsets, positions, false, true}, "next_bag");
  return b.op("aten::sub.Scalar", {after, int64_t{1}}, "bag");
}

// ---- _embedding_bag / _embedding_bag_forward_only(weight, indices, offsets, scale_grad_by_freq, mode,
// sparse, per_sample_weights?, include_last_offset, padding_idx) -> (output, offset2bag, bag_size,
// max_indices)

constexpr size_t kPerSampleWeights = 6;

std::vector<DimStrategy> embedding_bag(const OpSchema& s) {
  const Mode mode = mode_of(s);
  const Placement R = Replicate();
  auto strategy = [&](Placement output, Placement max_indices, Placement weight, Placement per_sample) {
    return DimStrategy{{output, R, R, max_indices}, by_argument(s, [&](size_t arg) {
                         return arg == 0 ? weight : arg == kPerSampleWeights ? per_sample : R;
                       })};
  };
  std::vector<DimStrategy> out = {
      strategy(R, R, R, R),
      strategy(Shard(1), mode == kMax ? Shard(1) : R, Shard(1), R),
  };
  if (mode == kMax) return out;
  out.push_back(strategy(Partial(), R, Shard(0), R));  // vocabulary_sharded_bags
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    out.push_back(strategy(Partial(op), R, Partial(op), R));
    if (s.input_at_arg(kPerSampleWeights)) out.push_back(strategy(Partial(op), R, R, Partial(op)));
  }
  return out;
}

// The row-sharded table: this rank's rows, each index weighted by whether this rank holds its row (and
// it is not padding_idx), its per-sample weight, and for a mean 1 / (its bag's size). The bag outputs
// come from the op itself on a 2-row stand-in table (row 1 for padding_idx, row 0 for every other
// index): they depend on nothing else, and so equal the single-device ones.
GraphForm vocabulary_sharded_bags(const OpSchema& s, const PlacementStrategy& chosen) {
  if (mesh_dims_sharding(chosen.inputs[0], 0).empty()) return {};
  const Shape& table = s.input(0).meta.shape;
  return [op = s.op_name(), rows = held_rows(s, table, chosen.inputs[0]), vocab = table[0], output_shape = local_output_shape(s, chosen),
          count = s.input(1).meta.shape[0], index_dtype = s.input(1).meta.dtype, dtype = s.input(0).meta.dtype,
          per_sample = s.input_at_arg(kPerSampleWeights).has_value()](GraphFormBuilder& b) {
    const FormValue weight = b.input(0), indices = b.input(1), offsets = b.input(2);
    const int64_t padding_idx = b.argument(8).toInt();
    const FormArg per_sample_weights = per_sample ? FormArg(b.input(kPerSampleWeights)) : FormArg(c10::IValue());
    check_indices_form(b, indices, vocab, "embedding_bag");
    const FormValue is_padding = b.op("aten::_to_copy", {b.op("aten::eq.Scalar", {indices, padding_idx}, "is_padding"), c10::IValue(index_dtype)}, "stand_in_index");
    const FormValue stand_in_table = b.op("aten::new_zeros", {weight, std::vector<int64_t>{2, 1}}, "stand_in_table");
    std::vector<FormValue> bags = b.call(op, {stand_in_table, is_padding, offsets,
                                              FormArg::as_called(3), FormArg::as_called(4), FormArg::as_called(5), per_sample_weights,
                                              FormArg::as_called(7), padding_idx >= 0 ? int64_t{1} : int64_t{-1}},
                                         "bags");
    if (rows.size == 0) {
      bags[0] = b.op("aten::new_zeros", {weight, output_shape}, "none_held");
      return bags;
    }
    const FormIndexWindow lookup = index_window_form(b, indices, rows.offset, rows.size, /*elsewhere=*/0, padding_idx);
    FormValue scale = b.op("aten::_to_copy", {lookup.held, c10::IValue(dtype)}, "held_weight");
    if (per_sample) scale = b.op("aten::mul.Tensor", {scale, b.input(kPerSampleWeights)}, "weighted");
    if (static_cast<Mode>(b.argument(4).toInt()) == kMean) {
      const FormValue sizes = b.op("aten::index_select", {bags[2], int64_t{0}, bag_of_each_index(b, offsets, count)}, "bag_sizes");
      scale = b.op("aten::div.Tensor", {scale, b.op("aten::clamp_min", {sizes, int64_t{1}}, "nonempty")}, "averaged");
    }
    bags[0] = b.call(op, {weight, lookup.local_index, offsets, false, static_cast<int64_t>(kSum), false, scale, FormArg::as_called(7), int64_t{-1}},
                     "rows_here")[0];
    return bags;
  };
}

// LibTorch has no Meta kernels for these ops (Python registers its own), and the shapes of the bag
// outputs follow the CPU kernel's choices (offset2bag is empty on its fast path for float sums): they
// come from the op itself on stand-ins of the same sizes, a one-row table and all indices and offsets
// 0 (padding_idx 0 or none, as the kernel's path depends on whether there is one).
std::vector<TensorMeta> bag_metas(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  auto stand_in = [](const at::Tensor& t, Shape shape) {  // `t` may be a DTensor: its sizes are global
    return at::zeros(shape, at::TensorOptions().dtype(t.scalar_type()));
  };
  torch::jit::Stack stack(args.begin(), args.end());
  const at::Tensor& weight = args[0].toTensor();
  stack[0] = stand_in(weight, {1, weight.size(1)});
  for (size_t i : {size_t{1}, size_t{2}, kPerSampleWeights})
    if (stack[i].isTensor() && stack[i].toTensor().defined())
      stack[i] = stand_in(stack[i].toTensor(), {stack[i].toTensor().size(0)});
  stack[8] = args[8].toInt() >= 0 ? int64_t{0} : int64_t{-1};
  op.callBoxed(stack);
  std::vector<TensorMeta> out;
  for (const auto& v : stack) {
    const at::Tensor& t = v.toTensor();
    out.push_back(TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  }
  return out;
}

// ---- _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
// num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights?, padding_idx) -> [num_weights, D]

constexpr size_t kMaximumIndices = 5, kBackwardPerSampleWeights = 10;

// The row-sharded gradient comes first, as for embedding_dense_backward (see embedding.cpp): the
// gradient of a row-sharded table arrives whole, and then each rank computes just its rows.
std::vector<DimStrategy> embedding_bag_backward(const OpSchema& s) {
  if (argument(s, "sparse").toBool())
    throw DTensorError("embedding_bag with sparse=true: sparse gradients of DTensors are not supported; use "
                       "sparse=false");
  const Mode mode = mode_of(s);
  const Placement R = Replicate();
  auto strategy = [&](Placement out, Placement grad, Placement max_indices, Placement per_sample) {
    return DimStrategy{{out}, by_argument(s, [&](size_t arg) {
                         return arg == 0 ? grad
                                : arg == kMaximumIndices ? max_indices
                                : arg == kBackwardPerSampleWeights ? per_sample
                                                                   : R;
                       })};
  };
  std::vector<DimStrategy> out;
  if (mode != kMax) out.push_back(strategy(Shard(0), R, R, R));  // rows_of_gradient
  out.push_back(strategy(R, R, R, R));
  out.push_back(strategy(Shard(1), Shard(1), mode == kMax ? Shard(1) : R, R));
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    out.push_back(strategy(Partial(op), Partial(op), R, R));
    if (s.input_at_arg(kBackwardPerSampleWeights)) out.push_back(strategy(Partial(op), R, R, Partial(op)));
  }
  return out;
}

// This rank's rows of the gradient: every index gets its bag's gradient, times its per-sample weight,
// divided by the bag size for a mean; then the rows add up as for embedding.
GraphForm rows_of_gradient(const OpSchema& s, const PlacementStrategy& chosen) {
  if (mesh_dims_sharding(chosen.outputs[0], 0).empty()) return {};
  return [rows = held_rows(s, s.outputs[0].shape, chosen.outputs[0]), width = s.outputs[0].shape[1], count = s.input(1).meta.shape[0],
          per_sample = s.input_at_arg(kBackwardPerSampleWeights).has_value()](GraphFormBuilder& b) {
    const FormValue grad = b.input(0), indices = b.input(1), offsets = b.input(2);
    check_indices_form(b, indices, b.argument(6).toInt(), "_embedding_bag_backward");
    const FormValue bags = bag_of_each_index(b, offsets, count);
    FormValue per_index = b.op("aten::index_select", {grad, int64_t{0}, bags}, "per_index");
    if (per_sample)
      per_index = b.op("aten::mul.Tensor", {per_index, b.op("aten::unsqueeze", {b.input(kBackwardPerSampleWeights), int64_t{1}}, "per_sample")},
                       "weighted");
    if (static_cast<Mode>(b.argument(8).toInt()) == kMean) {
      const FormValue sizes = b.op("aten::clamp_min", {b.op("aten::index_select", {b.input(4), int64_t{0}, bags}, "bag_sizes"), int64_t{1}}, "nonempty");
      per_index = b.op("aten::div.Tensor", {per_index, b.op("aten::unsqueeze", {sizes, int64_t{1}}, "per_row")}, "averaged");
    }
    return std::vector<FormValue>{rows_gradient_form(b, per_index, indices, rows, width, b.argument(11).toInt(), b.argument(7))};
  };
}

// No Meta kernel either: [num_weights, D] (contiguous, the gradient's dtype).
std::vector<TensorMeta> bag_backward_meta(const c10::OperatorHandle&, c10::ArrayRef<c10::IValue> args) {
  const at::Tensor& grad = args[0].toTensor();
  const Shape shape{args[6].toInt(), grad.size(-1)};
  return {TensorMeta{shape, contiguous_strides(shape), grad.scalar_type()}};
}

// ---- _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
// padding_idx) -> [number of indices]: each index's bag gradient dotted with its row.

std::vector<DimStrategy> per_sample_weights_backward(const OpSchema& s) {
  const Placement R = Replicate();
  auto strategy = [&](Placement out, Placement grad, Placement weight) {
    return DimStrategy{{out}, by_argument(s, [&](size_t arg) { return arg == 0 ? grad : arg == 1 ? weight : R; })};
  };
  std::vector<DimStrategy> out = {
      strategy(R, R, R),
      strategy(Partial(), Shard(1), Shard(1)),  // each rank's part of every dot product
      strategy(Partial(), R, Shard(0)),         // the rows held here (rows_of_dot_products), 0 elsewhere
  };
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    out.push_back(strategy(Partial(op), Partial(op), R));
    out.push_back(strategy(Partial(op), R, Partial(op)));
  }
  return out;
}

// One per index (the indices' count), the gradient's dtype.
std::vector<TensorMeta> per_sample_weights_meta(const c10::OperatorHandle&, c10::ArrayRef<c10::IValue> args) {
  const Shape shape{args[2].toTensor().size(0)};
  return {TensorMeta{shape, contiguous_strides(shape), args[0].toTensor().scalar_type()}};
}

GraphForm rows_of_dot_products(const OpSchema& s, const PlacementStrategy& chosen) {
  if (mesh_dims_sharding(chosen.inputs[1], 0).empty()) return {};
  const Shape& table = s.input(1).meta.shape;
  return [op = s.op_name(), rows = held_rows(s, table, chosen.inputs[1]), vocab = table[0], count = s.input(2).meta.shape[0]](GraphFormBuilder& b) {
    const FormValue indices = b.input(2);
    check_indices_form(b, indices, vocab, "_embedding_bag_per_sample_weights_backward");
    if (rows.size == 0) return std::vector<FormValue>{b.op("aten::new_zeros", {b.input(0), std::vector<int64_t>{count}}, "none_held")};
    const FormIndexWindow lookup = index_window_form(b, indices, rows.offset, rows.size, /*elsewhere=*/0, b.argument(6).toInt());
    const FormValue dots = b.op(op, {b.input(0), b.input(1), lookup.local_index, b.input(3), b.input(4), FormArg::as_called(5), int64_t{-1}}, "dots");
    return std::vector<FormValue>{b.op("aten::masked_fill.Scalar", {dots, b.op("aten::logical_not", {lookup.held}, "elsewhere"), 0.0}, "dots_here")};
  };
}

const bool embedding_bag_rules_registered = [] {
  using detail::register_overloads;
  const FormedKernel bags = written_as_form(vocabulary_sharded_bags), gradient = written_as_form(rows_of_gradient),
                     dot_products = written_as_form(rows_of_dot_products);
  register_overloads({"aten::_embedding_bag", "aten::_embedding_bag_forward_only"},
                     {.dim = embedding_bag,
                      .local_kernel = bags.kernel,
                      .graph_form = bags.graph_form,
                      .output_metas = bag_metas,
                      .family = "embedding"});
  register_overloads({"aten::_embedding_bag_backward"}, {.dim = embedding_bag_backward,
                                                         .local_kernel = gradient.kernel,
                                                         .graph_form = gradient.graph_form,
                                                         .output_metas = bag_backward_meta,
                                                         .family = "embedding"});
  register_overloads({"aten::_embedding_bag_per_sample_weights_backward"},
                     {.dim = per_sample_weights_backward,
                      .local_kernel = dot_products.kernel,
                      .graph_form = dot_products.graph_form,
                      .output_metas = per_sample_weights_meta,
                      .family = "embedding"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
