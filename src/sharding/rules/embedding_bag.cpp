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
#include "optional_tensors.h"
#include "rule_helpers.h"
#include "vocab_rows.h"

namespace dtensor::rules {
namespace {

enum Mode : int64_t { kSum = 0, kMean = 1, kMax = 2 };

Mode mode_of(const OpSchema& s) { return static_cast<Mode>(argument(s, "mode").toInt()); }

// The bag of every index: the last offset at or before its position (empty bags repeat an offset; with
// include_last_offset the final offset is the index count, past every position).
at::Tensor bag_of_each_index(const at::Tensor& offsets, int64_t count) {
  return at::searchsorted(offsets, at::arange(count, offsets.options()), /*out_int32=*/false, /*right=*/true) - 1;
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
LocalKernel vocabulary_sharded_bags(const OpSchema& s, const PlacementStrategy& chosen) {
  if (mesh_dims_sharding(chosen.inputs[0], 0).empty()) return {};
  const Shape& table = s.input(0).meta.shape;
  return [rows = held_rows(s, table, chosen.inputs[0]), vocab = table[0], output_shape = local_output_shape(s, chosen)](
             const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const at::Tensor &weight = args[0].toTensor(), &indices = args[1].toTensor(), &offsets = args[2].toTensor();
    const auto mode = static_cast<Mode>(args[4].toInt());
    const auto per_sample = args[kPerSampleWeights].toOptional<at::Tensor>();
    const bool include_last_offset = args[7].toBool();
    const int64_t padding_idx = args[8].toInt();
    check_indices(indices, vocab, "embedding_bag");

    torch::jit::Stack bags(args.begin(), args.end());
    bags[0] = at::zeros({2, 1}, weight.options());
    bags[1] = (indices == padding_idx).to(indices.scalar_type());
    bags[8] = padding_idx >= 0 ? int64_t{1} : int64_t{-1};
    op.callBoxed(bags);

    at::Tensor output = at::zeros(output_shape, weight.options());
    if (rows.size > 0) {
      const IndexWindow lookup = look_up_rows(indices, rows, padding_idx);
      at::Tensor scale = lookup.held.to(weight.scalar_type());
      if (per_sample && per_sample->defined()) scale.mul_(*per_sample);
      if (mode == kMean)
        scale.div_(bags[2].toTensor().index_select(0, bag_of_each_index(offsets, indices.numel())).clamp_min(1));
      output = std::get<0>(at::_embedding_bag(weight, lookup.local_index, offsets, /*scale_grad_by_freq=*/false, kSum,
                                              /*sparse=*/false, scale, include_last_offset, /*padding_idx=*/-1));
    }
    torch::jit::push(stack, output, bags[1], bags[2], bags[3]);
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
LocalKernel rows_of_gradient(const OpSchema& s, const PlacementStrategy& chosen) {
  if (mesh_dims_sharding(chosen.outputs[0], 0).empty()) return {};
  return [rows = held_rows(s, s.outputs[0].shape, chosen.outputs[0])](const c10::OperatorHandle& op,
                                                                      torch::jit::Stack& stack) {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const at::Tensor &grad = args[0].toTensor(), &indices = args[1].toTensor(), &offsets = args[2].toTensor();
    const at::Tensor& bag_size = args[4].toTensor();
    const int64_t num_weights = args[6].toInt();
    const auto per_sample = args[kBackwardPerSampleWeights].toOptional<at::Tensor>();
    check_indices(indices, num_weights, "_embedding_bag_backward");

    const at::Tensor bags = bag_of_each_index(offsets, indices.numel());
    at::Tensor per_index = grad.index_select(0, bags);
    if (per_sample && per_sample->defined()) per_index.mul_(per_sample->unsqueeze(1));
    if (static_cast<Mode>(args[8].toInt()) == kMean)
      per_index.div_(bag_size.index_select(0, bags).clamp_min(1).unsqueeze(1));
    torch::jit::push(stack, rows_gradient(per_index, indices, rows, args[11].toInt(), args[7].toBool()));
  };
}

// No Meta kernel either: [num_weights, D] (contiguous, the gradient's dtype).
std::vector<TensorMeta> backward_meta(const c10::OperatorHandle&, c10::ArrayRef<c10::IValue> args) {
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

LocalKernel rows_of_dot_products(const OpSchema& s, const PlacementStrategy& chosen) {
  if (mesh_dims_sharding(chosen.inputs[1], 0).empty()) return {};
  const Shape& table = s.input(1).meta.shape;
  return [rows = held_rows(s, table, chosen.inputs[1]), vocab = table[0]](const c10::OperatorHandle& op,
                                                                         torch::jit::Stack& stack) {
    auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const at::Tensor indices = args[2].toTensor();
    const int64_t padding_idx = args[6].toInt();
    check_indices(indices, vocab, "_embedding_bag_per_sample_weights_backward");
    if (rows.size == 0) return torch::jit::push(stack, at::zeros({indices.numel()}, args[0].toTensor().options()));
    const IndexWindow lookup = look_up_rows(indices, rows);
    args[2] = lookup.local_index;
    args[6] = int64_t{-1};
    op.callBoxed(args);
    torch::jit::push(stack, args[0].toTensor().masked_fill_(~(lookup.held & (indices != padding_idx)), 0));
  };
}

const bool embedding_bag_rules_registered = [] {
  using detail::register_overloads;
  register_overloads({"aten::_embedding_bag", "aten::_embedding_bag_forward_only"},
                     {.dim = embedding_bag,
                      .local_kernel = vocabulary_sharded_bags,
                      .output_metas = bag_metas,
                      .family = "embedding"});
  register_overloads({"aten::_embedding_bag_backward"}, {.dim = embedding_bag_backward,
                                                         .local_kernel = rows_of_gradient,
                                                         .output_metas = backward_meta,
                                                         .family = "embedding"});
  register_overloads({"aten::_embedding_bag_per_sample_weights_backward"},
                     {.dim = per_sample_weights_backward,
                      .local_kernel = rows_of_dot_products,
                      .output_metas = per_sample_weights_meta,
                      .family = "embedding"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
