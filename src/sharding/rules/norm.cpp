// Normalisation and softmax. These ops reduce over some dims (the softmax dim, layer_norm's
// normalized dims) and map the result back over them, so those dims must be Replicate; every other
// dim may be sharded, alike in all tensors. The backward ops are linear in the incoming gradient,
// so a Partial gradient gives Partial results. layer_norm's weight and bias are Replicate; their
// gradients sum over the (sharded) batch dims, so they come out Partial(sum). rms_norm decomposes into
// pow, mean, rsqrt and mul on DTensors, also on CUDA: _fused_rms_norm (the CUDA kernel) is
// CompositeImplicitAutograd, so only graphs exported on CUDA hold it, and its backward; they get
// layer_norm's rules (rstd keeps the input's rank, like layer_norm's mean and rstd).

#include "../registry.h"
#include "dtensor/layout.h"
#include "optional_tensors.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

// _softmax(self, dim, half_to_float) and _softmax_backward_data(grad_output, output, dim,
// input_dtype): sharded alike along any dim but `dim`. (_log_softmax, which cross_entropy runs on
// class-sharded logits, is the loss family's.)
std::vector<DimStrategy> softmax(const OpSchema& s) {
  const int64_t ndim = s.input_ndim(0);
  const int64_t dim = wrap_dim(argument(s, "dim").toInt(), ndim);
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
  return s.input_ndim(input) - static_cast<int64_t>(argument(s, "normalized_shape").toIntVector().size());
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd): mean and
// rstd keep the input's rank (normalized dims of size 1), so every output shards like the input.
// Also _fused_rms_norm(input, normalized_shape, weight?, eps) -> (out, rstd).
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
// Also _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight?, output_mask) ->
// (grad_input?, grad_weight?).
std::vector<DimStrategy> layer_norm_backward(const OpSchema& s) {
  const auto sharded_like_input = [&](size_t arg) {
    const std::string& name = s.schema.arguments()[arg].name();
    return name == "grad_out" || name == "input" || name == "mean" || name == "rstd";
  };
  const std::vector<bool> mask = argument(s, "output_mask").toBoolList().vec();
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
    out.push_back({outputs(Shard(d), Partial()),
                   by_argument(s, [&](size_t arg) { return sharded_like_input(arg) ? Placement(Shard(d)) : Replicate(); })});
  }
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    DimStrategy st{outputs(Partial(op), Partial(op)), Placements(s.inputs.size(), Replicate())};
    st.inputs[0] = Partial(op);
    out.push_back(std::move(st));
  }
  return out;
}

// native_layer_norm_backward's CPU kernel reads mean and rstd as if contiguous, whatever their strides
// (torch 2.15: given rows 0-15 of [2, 32, 1] statistics it reads the second batch's from the first's
// rows 16-31). A shard of them along a later dim than the first (the sequence) is such a slice where a
// graph program cuts it from the whole, so those strategies pass them on contiguous.
constexpr size_t kLayerNormMean = 3, kLayerNormRstd = 4;

bool statistics_sliced(const OpSchema& s, const PlacementStrategy& chosen) {
  const std::optional<size_t> mean = s.input_at_arg(kLayerNormMean);
  if (!mean) return false;
  const Placements& p = chosen.inputs[*mean];
  return std::any_of(p.begin(), p.end(), [](const Placement& q) { return q.is_sharding() && q.dim() > 0; });
}

LocalKernel contiguous_statistics(const OpSchema& s, const PlacementStrategy& chosen) {
  if (!statistics_sliced(s, chosen)) return {};
  return [](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const size_t first = stack.size() - op.schema().arguments().size();
    for (size_t arg : {kLayerNormMean, kLayerNormRstd}) stack[first + arg] = stack[first + arg].toTensor().contiguous();
    op.callBoxed(stack);
  };
}

GraphForm contiguous_statistics_form(const OpSchema& s, const PlacementStrategy& chosen) {
  if (!statistics_sliced(s, chosen)) return {};
  std::vector<bool> present(s.schema.arguments().size(), false);
  for (const auto& in : s.inputs) present[in.arg] = true;
  return [present, qualified = detail::qualified_name(s.schema.operator_name())](GraphFormBuilder& b) -> std::vector<FormValue> {
    std::vector<FormArg> args;
    for (size_t a = 0; a < present.size(); ++a) {
      if (a == kLayerNormMean || a == kLayerNormRstd) args.push_back(b.op("aten::clone", {b.input(a)}, a == kLayerNormMean ? "mean" : "rstd"));
      else args.push_back(present[a] ? FormArg(b.input(a)) : FormArg::as_called(a));
    }
    return b.call(qualified, std::move(args), "layer_norm_backward");
  };
}

// _fused_rms_norm_backward's global outputs (it has no C++ Meta kernel): the gradients are shaped
// like the input and the weight.
std::vector<TensorMeta> rms_norm_backward_metas(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const auto mask = args[*op.schema().argumentIndexWithName("output_mask")].toBoolList().vec();
  std::vector<TensorMeta> out;
  auto like = [&](const char* name) {
    const c10::IValue& v = args[*op.schema().argumentIndexWithName(name)];
    if (!v.isTensor() || !v.toTensor().defined()) return;
    const at::Tensor& t = v.toTensor();
    out.push_back(TensorMeta{t.sizes().vec(), contiguous_strides(t.sizes().vec()), t.scalar_type()});
  };
  if (mask.at(0)) like("input");
  if (mask.at(1)) like("weight");
  return out;
}

const bool norm_rules_registered = [] {
  using detail::register_overloads;
  register_overloads({"aten::_softmax"}, {.dim = softmax, .family = "norm", .strided_shards = detail::StridedShards::IndexWise});
  // softmax that gives 0, not NaN, for a row of -inf (masked attention rows): the same dims.
  register_overloads({"aten::_safe_softmax"}, {.dim = softmax, .family = "norm", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::_softmax_backward_data"}, {.dim = softmax_backward, .family = "norm", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::native_layer_norm"}, {.dim = layer_norm, .family = "norm", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::native_layer_norm_backward"}, {.dim = layer_norm_backward, .local_kernel = contiguous_statistics,
                                                             .graph_form = contiguous_statistics_form, .family = "norm",
                                                             .strided_shards = detail::StridedShards::IndexWise});
  // Their composite forms, kept whole in exported graphs: the same math, one output.
  detail::register_composite({"aten::softmax.int"}, {.dim = softmax, .family = "composite"});
  detail::register_composite({"aten::layer_norm"}, {.dim = layer_norm, .family = "composite"});
  detail::register_composite({"aten::_fused_rms_norm"}, {.dim = layer_norm, .family = "composite"});
  register_overloads({"aten::_fused_rms_norm_backward"},
                     {.dim = layer_norm_backward, .output_metas = rms_norm_backward_metas, .family = "norm"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
