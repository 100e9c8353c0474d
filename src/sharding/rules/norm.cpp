// Normalisation and softmax. These ops reduce over some dims (the softmax dim, layer_norm's
// normalized dims) and map the result back over them, so those dims must be Replicate; every other
// dim may be sharded, alike in all tensors. The backward ops are linear in the incoming gradient,
// so a Partial gradient gives Partial results. layer_norm's weight and bias are Replicate; their
// gradients sum over the (sharded) batch dims, so they come out Partial(sum). rms_norm has no op of
// its own on CPU: it decomposes into pow, mean, rsqrt and mul.

#include "../registry.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

const c10::IValue& arg(const OpSchema& s, const char* name) { return s.args[*s.schema.argumentIndexWithName(name)]; }

// _softmax(self, dim, half_to_float) and _softmax_backward_data(grad_output, output, dim,
// input_dtype): sharded alike along any dim but `dim`. (_log_softmax, which cross_entropy runs on
// class-sharded logits, is the loss family's.)
std::vector<DimStrategy> softmax(const OpSchema& s) {
  const int64_t ndim = s.input_ndim(0);
  const int64_t dim = wrap_dim(arg(s, "dim").toInt(), ndim);
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < ndim; ++d)
    if (d != dim) out.push_back({{Shard(d)}, Placements(s.inputs.size(), Shard(d))});
  return out;
}

// The backward op also takes a Partial gradient (with the forward output Replicate).
std::vector<DimStrategy> softmax_backward(const OpSchema& s) {
  std::vector<DimStrategy> out = softmax(s);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{Partial(op)}, {Partial(op), Replicate()}});
  return out;
}

// The number of leading (batch) dims of layer_norm's input, the ones that are not normalized.
int64_t batch_dims(const OpSchema& s, size_t input) {
  return s.input_ndim(input) - static_cast<int64_t>(arg(s, "normalized_shape").toIntVector().size());
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd): mean and
// rstd keep the input's rank (normalized dims of size 1), so every output shards like the input.
std::vector<DimStrategy> layer_norm(const OpSchema& s) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < batch_dims(s, 0); ++d) {
    DimStrategy st{Placements(s.outputs.size(), Shard(d)), Placements(s.inputs.size(), Replicate())};
    st.inputs[0] = Shard(d);  // weight and bias stay Replicate
    out.push_back(std::move(st));
  }
  return out;
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask) -> (grad_input?, grad_weight?, grad_bias?), each present when output_mask says so.
std::vector<DimStrategy> layer_norm_backward(const OpSchema& s) {
  const std::vector<bool> mask = arg(s, "output_mask").toBoolList().vec();
  // placements of the present outputs: grad_input like the input, grad_weight / grad_bias `params`
  auto outputs = [&](Placement grad_input, Placement params) {
    Placements p;
    for (size_t k = 0; k < mask.size(); ++k)
      if (mask[k]) p.push_back(k == 0 ? grad_input : params);
    return p;
  };
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < batch_dims(s, 1); ++d) {
    // grad_out, input, mean, rstd sharded; weight and bias Replicate
    DimStrategy st{outputs(Shard(d), Partial()), Placements(s.inputs.size(), Replicate())};
    for (size_t i = 0; i < 4; ++i) st.inputs[i] = Shard(d);
    out.push_back(std::move(st));
  }
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    DimStrategy st{outputs(Partial(op), Partial(op)), Placements(s.inputs.size(), Replicate())};
    st.inputs[0] = Partial(op);
    out.push_back(std::move(st));
  }
  return out;
}

const bool registered = [] {
  using detail::register_overloads;
  register_overloads({"aten::_softmax"}, {.dim = softmax, .family = "norm", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::_softmax_backward_data"}, {.dim = softmax_backward, .family = "norm", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::native_layer_norm"}, {.dim = layer_norm, .family = "norm", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::native_layer_norm_backward"}, {.dim = layer_norm_backward, .family = "norm", .strided_shards = detail::StridedShards::IndexWise});
  // Their composite forms, kept whole in exported graphs: the same math, one output.
  detail::register_composite({"aten::softmax.int"}, {.dim = softmax, .family = "composite"});
  detail::register_composite({"aten::layer_norm"}, {.dim = layer_norm, .family = "composite"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
