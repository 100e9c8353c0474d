// The fused attention kernels CUDA dispatch picks for scaled_dot_product_attention: flash,
// memory-efficient and cuDNN, forward and backward. Like the CPU kernel (attention.cpp) they work per
// batch entry and per head, so q, k, v and every tensor shaped like them (the output, logsumexp, the
// gradients) shard alike on dim 0 or dim 1, heads only when keys have as many heads as queries. The
// query dim stays whole: these kernels return the query and key lengths as integers (max_q, max_k)
// that the backward takes back, and PyTorch's DTensor shards them the same way. Their random-number
// state (philox seed and offset), cumulative sequence lengths and debug mask are Replicate, and
// attention with dropout runs replicated. An attention bias is placed like the CPU kernel's mask.
//
// They have no C++ Meta kernel (PyTorch registers theirs in Python, torch/_meta_registrations.py), so
// the global output metas are computed here, after those registrations.

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>

#include "../registry.h"
#include "attention_mask.h"
#include "dtensor/errors.h"
#include "dtensor/layout.h"
#include "optional_tensors.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

constexpr int64_t kFusedBatch = 0, kFusedHeads = 1;

// Arguments that stay Replicate whatever is sharded.
const std::set<std::string> kReplicatedArguments = {"cum_seq_q", "cum_seq_k", "philox_seed", "philox_offset"};

// How one kernel's outputs shard: the first `sharded_outputs` like the query, the rest Replicate;
// `bias_gradient` is the output index of the bias gradient (placed like the bias), if any.
struct Outputs {
  size_t sharded_outputs;
  std::optional<size_t> bias_gradient = std::nullopt;
};

const at::Tensor& tensor_argument(c10::ArrayRef<c10::IValue> args, const c10::FunctionSchema& schema, const char* name) {
  return args[*schema.argumentIndexWithName(name)].toTensor();
}

std::vector<int64_t> shardable_dims(const OpSchema& s) {
  if (argument(s, "dropout_p").toDouble() != 0) return {};
  const Shape& q = s.input(*s.input_at_arg(*s.schema.argumentIndexWithName("query"))).meta.shape;
  const Shape& k = s.input(*s.input_at_arg(*s.schema.argumentIndexWithName("key"))).meta.shape;
  if (q.size() != 4 || k.size() != 4) return {};
  std::vector<int64_t> dims = {kFusedBatch};
  if (q[kFusedHeads] == k[kFusedHeads]) dims.push_back(kFusedHeads);
  return dims;
}

std::vector<DimStrategy> strategies(const OpSchema& s, const Outputs& outputs) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  const auto bias_arg = s.schema.argumentIndexWithName("attn_bias");
  for (int64_t d : shardable_dims(s)) {
    std::optional<Placement> bias;
    const Placements inputs = by_argument(s, [&](size_t arg) -> Placement {
      if (arg == bias_arg) return *(bias = attention_mask_placement(s, *s.input_at_arg(arg), d));
      return kReplicatedArguments.count(s.schema.arguments()[arg].name()) ? Placement(Replicate()) : Placement(Shard(d));
    });
    Placements results(s.outputs.size(), Replicate());
    for (size_t k = 0; k < results.size(); ++k) {
      if (k == outputs.bias_gradient) results[k] = bias.value_or(Replicate());
      else if (k < outputs.sharded_outputs) results[k] = Shard(d);
    }
    out.push_back({std::move(results), inputs});
  }
  return out;
}

// ---- global output metas --------------------------------------------------------------------------

TensorMeta contiguous_meta(Shape shape, c10::ScalarType dtype) {
  Shape strides = contiguous_strides(shape);
  return TensorMeta{std::move(shape), std::move(strides), dtype};
}

// Dense strides for `shape` with its dims ordered in memory as `order` lists them (outermost first).
TensorMeta permuted_meta(const Shape& shape, const std::vector<int64_t>& order, c10::ScalarType dtype) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (auto d = order.rbegin(); d != order.rend(); ++d) {
    strides[static_cast<size_t>(*d)] = stride;
    stride *= std::max<int64_t>(shape[static_cast<size_t>(*d)], 1);
  }
  return TensorMeta{shape, std::move(strides), dtype};
}

// A result laid out in memory as `like` is (the kernels' alloc_with_matching_layout).
TensorMeta layout_like(const at::Tensor& like, const Shape& shape) {
  std::vector<int64_t> order(shape.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  return permuted_meta(shape, order, like.scalar_type());
}

TensorMeta meta_of(const at::Tensor& t) { return TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()}; }

void refuse_debug_mask(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const auto debug = op.schema().argumentIndexWithName("return_debug_mask");
  if (debug && args[*debug].toBool())
    throw DTensorError(detail::qualified_name(op.operator_name()) + " with return_debug_mask=True is not supported on DTensors: "
                       "the debug mask is the kernel's internal dropout pattern; run it on local tensors");
}

// (output, logsumexp, cum_seq_q: None, cum_seq_k: None, max_q, max_k, rng_state, unused, debug_attn_mask)
std::vector<TensorMeta> flash_metas(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  refuse_debug_mask(op, args);
  const at::Tensor& q = tensor_argument(args, op.schema(), "query");
  const at::Tensor& v = tensor_argument(args, op.schema(), "value");
  return {layout_like(q, {q.size(0), q.size(1), q.size(2), v.size(3)}), contiguous_meta({q.size(0), q.size(1), q.size(2)}, at::kFloat),
          contiguous_meta({2}, at::kUInt64), contiguous_meta({}, at::kUInt64), contiguous_meta({0}, q.scalar_type())};
}

// (output, log_sumexp, philox_seed, philox_offset); the output is laid out [batch, queries, heads, dim],
// logsumexp padded to a multiple of 32 queries (empty unless compute_log_sumexp).
std::vector<TensorMeta> efficient_metas(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const at::Tensor& q = tensor_argument(args, op.schema(), "query");
  const at::Tensor& v = tensor_argument(args, op.schema(), "value");
  const bool log_sumexp = args[*op.schema().argumentIndexWithName("compute_log_sumexp")].toBool();
  const int64_t padded = log_sumexp ? (q.size(2) + 31) / 32 * 32 : 0;
  return {permuted_meta({q.size(0), q.size(1), q.size(2), v.size(3)}, {0, 2, 1, 3}, q.scalar_type()),
          contiguous_meta({q.size(0), q.size(1), padded}, at::kFloat), contiguous_meta({}, at::kLong),
          contiguous_meta({}, at::kLong)};
}

// (output, logsumexp, cum_seq_q: None, cum_seq_k: None, max_q, max_k, philox_seed, philox_offset,
// debug_attn_mask: None)
std::vector<TensorMeta> cudnn_metas(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  refuse_debug_mask(op, args);
  const at::Tensor& q = tensor_argument(args, op.schema(), "query");
  const at::Tensor& v = tensor_argument(args, op.schema(), "value");
  return {layout_like(q, {q.size(0), q.size(1), q.size(2), v.size(3)}), contiguous_meta({q.size(0), q.size(1), q.size(2), 1}, at::kFloat),
          contiguous_meta({}, at::kLong), contiguous_meta({}, at::kLong)};
}

// (grad_query, grad_key, grad_value), each like its input.
std::vector<TensorMeta> gradients_like_inputs(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  std::vector<TensorMeta> out;
  for (const char* name : {"query", "key", "value"}) out.push_back(meta_of(tensor_argument(args, op.schema(), name)));
  return out;
}

// (grad_query, grad_key, grad_value, grad_bias?): gradients laid out [batch, length, heads, dim]; the
// bias gradient (when asked) is a view of a buffer whose last dim is padded to a multiple of 16.
std::vector<TensorMeta> efficient_backward_metas(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  std::vector<TensorMeta> out;
  for (const char* name : {"query", "key", "value"}) {
    const at::Tensor& t = tensor_argument(args, op.schema(), name);
    out.push_back(permuted_meta(t.sizes().vec(), {0, 2, 1, 3}, t.scalar_type()));
  }
  const c10::IValue& bias = args[*op.schema().argumentIndexWithName("attn_bias")];
  const auto mask = args[*op.schema().argumentIndexWithName("grad_input_mask")].toBoolList().vec();
  if (bias.isTensor() && bias.toTensor().defined() && mask.at(3)) {
    const at::Tensor& b = bias.toTensor();
    Shape padded = b.sizes().vec();
    padded.back() = (padded.back() + 15) / 16 * 16;
    out.push_back(TensorMeta{b.sizes().vec(), contiguous_strides(padded), b.scalar_type()});
  }
  return out;
}

detail::OpRule rule(size_t sharded_outputs, OutputMetaRule metas, std::optional<size_t> bias_gradient = std::nullopt) {
  const Outputs outputs{sharded_outputs, bias_gradient};
  return {.dim = [outputs](const OpSchema& s) { return strategies(s, outputs); }, .output_metas = std::move(metas), .family = "attention"};
}

const bool fused_attention_rules_registered = [] {
  using detail::register_overloads;
  register_overloads({"aten::_scaled_dot_product_flash_attention"}, rule(2, flash_metas));
  register_overloads({"aten::_scaled_dot_product_flash_attention_backward"}, rule(3, gradients_like_inputs));
  register_overloads({"aten::_scaled_dot_product_efficient_attention"}, rule(2, efficient_metas));
  register_overloads({"aten::_scaled_dot_product_efficient_attention_backward"}, rule(3, efficient_backward_metas, 3));
  register_overloads({"aten::_scaled_dot_product_cudnn_attention"}, rule(2, cudnn_metas));
  register_overloads({"aten::_scaled_dot_product_cudnn_attention_backward"}, rule(3, gradients_like_inputs));
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
