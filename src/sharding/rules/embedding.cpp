// Embedding lookups (aten::embedding, table [V, D], integer indices) and their gradient
// (aten::embedding_dense_backward). Sharding the indices shards the looked-up rows; a column-sharded
// table (Shard(1)) gives each rank its slice of every row; a row-sharded table (Shard(0), the
// vocabulary split over ranks, uneven V allowed) is a masked lookup: each rank looks up only the
// indices in its row range and gives zeros for the others, so the lookups add up (Partial(sum)).
// The gradient of a row-sharded table is computed the same way, for this rank's rows only.

#include <ATen/ATen.h>
#include <ATen/core/stack.h>

#include "../registry.h"
#include "rule_helpers.h"
#include "vocab_rows.h"

namespace dtensor::rules {
namespace {

// ---- embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse) ---------------------------

std::vector<DimStrategy> embedding(const OpSchema& s) {
  const int64_t index_dims = s.input_ndim(1);
  std::vector<DimStrategy> out = {
      all_replicate(s),
      {{Shard(index_dims)}, {Shard(1), Replicate()}},  // column-sharded table: each rank's slice of every row
      {{Partial()}, {Shard(0), Replicate()}},          // row-sharded table: masked lookups (masked_lookup)
  };
  for (int64_t d = 0; d < index_dims; ++d) out.push_back({{Shard(d)}, {Replicate(), Shard(d)}});
  // A lookup is linear in the table.
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{Partial(op)}, {Partial(op), Replicate()}});
  return out;
}

// Row-sharded table: rows held elsewhere look up as zeros. padding_idx only matters to the gradient.
LocalKernel masked_lookup(const OpSchema& s, const PlacementStrategy& chosen) {
  if (mesh_dims_sharding(chosen.inputs[0], 0).empty()) return {};
  const Shape& table = s.input(0).meta.shape;
  const ChunkExtent rows = held_rows(s, table, chosen.inputs[0]);
  return [rows, vocab = table[0]](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const at::Tensor &weight = args[0].toTensor(), &indices = args[1].toTensor();
    check_indices(indices, vocab, "embedding");
    std::vector<int64_t> shape = indices.sizes().vec();
    shape.push_back(weight.size(1));
    if (rows.size == 0) return torch::jit::push(stack, at::zeros(shape, weight.options()));
    const IndexWindow lookup = look_up_rows(indices, rows);
    at::Tensor out = at::embedding(weight, lookup.local_index);
    if (!lookup.all_held) out.masked_fill_(lookup.held.logical_not().unsqueeze(-1), 0);
    torch::jit::push(stack, out);
  };
}

// masked_lookup as graph ops. The indices are whole (the strategy replicates them), so their local
// shape is the global one.
GraphForm masked_lookup_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const Shape& table = s.input(0).meta.shape;
  const ChunkExtent rows = held_rows(s, table, chosen.inputs[0]);
  std::vector<int64_t> looked_up_shape = s.input(1).meta.shape;
  looked_up_shape.push_back(table[1]);
  return [rows, looked_up_shape](GraphFormBuilder& b) -> std::vector<FormValue> {
    const FormValue weight = b.input(0), indices = b.input(1);
    if (rows.size == 0) return {b.op("aten::new_zeros", {weight, looked_up_shape}, "none_held")};
    const FormIndexWindow window = index_window_form(b, indices, rows.offset, rows.size);
    const FormValue looked = b.op("aten::embedding", {weight, window.local_index}, "local_lookup");
    const FormValue missing = b.op("aten::logical_not", {b.op("aten::unsqueeze", {window.held, int64_t{-1}}, "held_rows")}, "missing");
    return {b.op("aten::masked_fill.Scalar", {looked, missing, 0.0}, "lookup")};
  };
}

// ---- embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq) --

// The row-sharded gradient comes first, so it is chosen when the gradient and the indices are both
// whole: that is how the gradient of a row-sharded table arrives (its lookup's output was
// Partial), and then every rank gets just its rows of the [V, D] gradient instead of all of it. A
// replicated table reaches this op with sharded indices (Partial gradient) or a Shard(-1) gradient
// (column-sharded table), so it is not affected unless the whole computation is replicated, where
// its gradient ends up row-sharded too (values are the same; the update gathers it).
std::vector<DimStrategy> embedding_backward(const OpSchema& s) {
  const int64_t index_dims = s.input_ndim(1);
  const bool scale_by_frequency = s.args[4].toBool();
  std::vector<DimStrategy> out = {
      {{Shard(0)}, {Replicate(), Replicate()}},  // this rank's rows (rows_gradient)
      all_replicate(s),
      {{Shard(1)}, {Shard(index_dims), Replicate()}},  // column-sharded table
  };
  // Gradients of lookups made on different ranks add up, unless they are scaled by how often an
  // index occurs, which needs the counts over all indices.
  if (!scale_by_frequency)
    for (int64_t d = 0; d < index_dims; ++d) out.push_back({{Partial()}, {Shard(d), Shard(d)}});
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{Partial(op)}, {Partial(op), Replicate()}});
  return out;
}

LocalKernel masked_backward(const OpSchema& s, const PlacementStrategy& chosen) {
  if (mesh_dims_sharding(chosen.outputs[0], 0).empty()) return {};
  const ChunkExtent rows = held_rows(s, s.outputs[0].shape, chosen.outputs[0]);
  return [rows](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const at::Tensor &grad = args[0].toTensor(), &indices = args[1].toTensor();
    const int64_t num_weights = args[2].toInt();
    check_indices(indices, num_weights, "embedding_dense_backward");
    torch::jit::push(stack, rows_gradient(grad, indices, rows, args[3].toInt(), args[4].toBool()));
  };
}

// masked_backward as graph ops: rows_gradient, with every index outside this rank's rows (and
// padding_idx) sent to one extra row that is dropped.
GraphForm masked_backward_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const ChunkExtent rows = held_rows(s, s.outputs[0].shape, chosen.outputs[0]);
  return [rows, width = s.outputs[0].shape[1]](GraphFormBuilder& b) -> std::vector<FormValue> {
    return {rows_gradient_form(b, b.input(0), b.input(1), rows, width, b.argument(3).toInt(), b.argument(4))};
  };
}

// The op has no Meta kernel, and running it on stand-ins of the global shapes would allocate the
// whole [V, D] gradient that row sharding avoids: [num_weights, D], contiguous, grad_output's dtype.
std::vector<TensorMeta> backward_meta(const c10::OperatorHandle&, c10::ArrayRef<c10::IValue> args) {
  const at::Tensor& grad = args[0].toTensor();  // a DTensor: its sizes are the global ones
  const Shape shape{args[2].toInt(), grad.size(-1)};
  return {TensorMeta{shape, contiguous_strides(shape), grad.scalar_type()}};
}

const bool embedding_rules_registered = [] {
  detail::register_family({"aten::embedding"}, {.dim = embedding, .local_kernel = masked_lookup, .graph_form = masked_lookup_form, .family = "embedding"});
  detail::register_family({"aten::embedding_dense_backward"},
                          {.dim = embedding_backward, .local_kernel = masked_backward, .graph_form = masked_backward_form,
                           .output_metas = backward_meta,
                           .family = "embedding"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
