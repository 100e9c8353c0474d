// Scaled dot-product attention on [batch, heads, length, head_dim] tensors. Attention is independent
// per batch entry and per head, so q, k, v (and the mask's matching dims) shard alike on dim 0 or 1:
// tensor-parallel attention shards heads. It is also independent per query, so queries alone may be
// sharded along their length (k and v Replicate) unless the mask is causal, which depends on a
// query's absolute position; in backward that makes the k and v gradients partial sums. Dropout draws
// random numbers per element, so attention with dropout runs replicated.
//
// With q, k and v all sharded along the sequence (context parallelism) and neither mask nor dropout,
// the CPU kernels run by ring or all-to-all (sequence_attention.h).
//
// Eager dispatch sees the CPU kernels (_scaled_dot_product_flash_attention_for_cpu and its backward)
// or the math decomposition, as single-device dispatch would choose; exported graphs keep the
// composite aten::scaled_dot_product_attention, which gets the forward rule too.

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "../registry.h"
#include "attention_mask.h"
#include "form_helpers.h"
#include "optional_tensors.h"
#include "rule_helpers.h"
#include "sequence_attention.h"

namespace dtensor::rules {
namespace {

constexpr int64_t kBatch = 0, kHeads = 1, kQueries = 2;

// Where the key-like inputs (k, v) and the mask sit among the arguments; every other tensor is shaped
// like the query (or like its first three dims: logsumexp), argument 0 among them.
struct Roles {
  std::vector<size_t> key_like;
  size_t mask;
};

const Roles kForward = {{1, 2}, 5};    // _scaled_dot_product_flash_attention_for_cpu(q, k, v, p, causal, *, mask)
const Roles kComposite = {{1, 2}, 3};  // scaled_dot_product_attention(q, k, v, mask, p, causal, ...)
const Roles kBackward = {{2, 3}, 8};   // ..._backward(grad_out, q, k, v, out, lse, p, causal, *, mask)

bool contains(const std::vector<size_t>& v, size_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Dims that may be sharded: batch always; heads where keys have as many, or where `grouped` (the CPU
// flash kernels, which pair query head h with key head h / (query heads / key heads)) as a whole group
// of them (keep_heads_paired checks that the key heads divide by the ranks); queries unless causal.
std::vector<int64_t> shardable_dims(const OpSchema& s, const Roles& roles, bool grouped) {
  const auto dropout = s.schema.argumentIndexWithName("dropout_p");
  if (dropout && s.args[*dropout].toDouble() != 0) return {};
  const Shape& q = s.input(*s.input_at_arg(0)).meta.shape;  // the query, or grad_out shaped like it
  const Shape& k = s.input(*s.input_at_arg(roles.key_like[0])).meta.shape;
  if (q.size() != 4 || k.size() != 4) return {};
  std::vector<int64_t> dims = {kBatch};
  if (q[kHeads] == k[kHeads] || (grouped && k[kHeads] > 0 && q[kHeads] % k[kHeads] == 0)) dims.push_back(kHeads);
  if (!argument(s, "is_causal").toBool()) dims.push_back(kQueries);
  return dims;
}

// Every input sharded like the query along `dim` (for queries: key-like inputs Replicate).
Placements inputs_along(const OpSchema& s, const Roles& roles, int64_t dim) {
  return by_argument(s, [&](size_t arg) -> Placement {
    if (arg == roles.mask) return attention_mask_placement(s, *s.input_at_arg(arg), dim);
    if (dim == kQueries && contains(roles.key_like, arg)) return Replicate();
    return Shard(dim);
  });
}

std::vector<DimStrategy> forward(const OpSchema& s, const Roles& roles, bool grouped = false) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d : shardable_dims(s, roles, grouped))
    out.push_back({Placements(s.outputs.size(), Shard(d)), inputs_along(s, roles, d)});
  return out;
}

const SequenceRoles kSequenceForward = {1, 2, 5, 1}, kSequenceBackward = {2, 3, 8, 2};

std::vector<DimStrategy> flash_forward(const OpSchema& s) {
  std::vector<DimStrategy> out = forward(s, kForward, /*grouped=*/true);
  if (sequence_applies(s, kSequenceForward)) out.push_back(sequence_strategy(s));
  return out;
}

// -> (grad_query, grad_key, grad_value). Linear in grad_out, so a Partial one gives Partial gradients.
std::vector<DimStrategy> backward(const OpSchema& s) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d : shardable_dims(s, kBackward, /*grouped=*/true)) {
    const Placement keys = d == kQueries ? Placement(Partial()) : Placement(Shard(d));
    out.push_back({{Shard(d), keys, keys}, inputs_along(s, kBackward, d)});
  }
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    DimStrategy st = all_replicate(s);
    st.outputs = Placements(3, Partial(op));
    st.inputs[0] = Partial(op);
    out.push_back(std::move(st));
  }
  return out;
}

std::vector<DimStrategy> flash_backward(const OpSchema& s) {
  std::vector<DimStrategy> out = backward(s);
  if (sequence_applies(s, kSequenceBackward)) out.push_back(sequence_strategy(s));
  return out;
}

// Grouped-query heads sharded stay paired only where every rank holds whole groups: the key heads
// divide by the ranks they are sharded over (2 key heads pair up over 2 ranks, not over 4).
OpStrategy keep_heads_paired(const OpSchema& s, const Roles& roles, OpStrategy all) {
  const int64_t key_heads = s.input(*s.input_at_arg(roles.key_like[0])).meta.shape[kHeads];
  if (s.input(*s.input_at_arg(0)).meta.shape[kHeads] == key_heads) return all;
  const size_t key = *s.input_at_arg(roles.key_like[0]);
  std::erase_if(all, [&](const PlacementStrategy& st) {
    int64_t ranks = 1;
    for (int64_t m = 0; m < s.mesh->ndim(); ++m)
      if (st.inputs[key][static_cast<size_t>(m)] == Placement(Shard(kHeads))) ranks *= s.mesh->size(m);
    return key_heads % ranks != 0;
  });
  return all;
}

// The CPU kernels reject shards without queries (5 heads over 4 ranks leave one rank none): their
// value there is empty outputs and zero key gradients.
const FormedKernel empty_queries = zero_outputs_when_empty(0);

// The mesh dim a chosen strategy runs context-parallel attention over, if any.
std::optional<int64_t> context_parallel_dim(const OpSchema& s, const SequenceRoles& roles, const PlacementStrategy& chosen) {
  return sequence_applies(s, roles) ? sequence_dim(s, roles, chosen) : std::nullopt;
}

LocalKernel flash_forward_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  const auto dim = context_parallel_dim(s, kSequenceForward, chosen);
  return dim ? sequence_forward_kernel(s, kSequenceForward, chosen, *dim) : empty_queries.kernel(s, chosen);
}

LocalKernel flash_backward_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  const auto dim = context_parallel_dim(s, kSequenceBackward, chosen);
  return dim ? sequence_backward_kernel(s, kSequenceBackward, chosen, *dim) : empty_queries.kernel(s, chosen);
}

// The CPU flash kernels have no Meta kernel, and running them on stand-ins of the global shapes would
// compute whole attention (quadratic in the sequence that context parallelism shards) on every rank:
// their outputs' metas, as the kernels lay them out. Forward: the output laid out like the queries,
// the logsumexp [batch, heads, positions] heads-last, in the accumulation type. Backward: each
// gradient shaped like its input, laid out [batch, positions, heads, head dim].
Shape heads_last_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);  // [batch, heads, positions(, head dim)] over [batch, positions, heads(, head dim)] memory
  const int64_t inner = shape.size() == 4 ? shape[3] : 1;
  strides[1] = inner;
  strides[2] = shape[1] * inner;
  strides[0] = shape[2] * strides[2];
  return strides;
}

std::vector<TensorMeta> flash_forward_metas(const c10::OperatorHandle&, c10::ArrayRef<c10::IValue> args) {
  const at::Tensor& q = args[0].toTensor();  // DTensors: their sizes are the global ones
  const Shape out_shape{q.size(0), q.size(1), q.size(2), args[2].toTensor().size(3)}, lse_shape{q.size(0), q.size(1), q.size(2)};
  // Like the queries, as empty_like lays it out (their strides are the DTensor's global ones).
  const at::Tensor like_q = at::empty_like(at::empty_strided(q.sizes(), q.strides(), q.options().device(at::kMeta)));
  const Shape out_strides = out_shape == q.sizes().vec() ? like_q.strides().vec() : contiguous_strides(out_shape);
  return {TensorMeta{out_shape, out_strides, q.scalar_type()},
          TensorMeta{lse_shape, heads_last_strides(lse_shape), at::toOpMathType(q.scalar_type())}};
}

std::vector<TensorMeta> flash_backward_metas(const c10::OperatorHandle&, c10::ArrayRef<c10::IValue> args) {
  std::vector<TensorMeta> out;
  for (size_t i : {1, 2, 3}) {
    const at::Tensor& t = args[i].toTensor();
    out.push_back(TensorMeta{t.sizes().vec(), heads_last_strides(t.sizes().vec()), t.scalar_type()});
  }
  return out;
}

GraphForm flash_forward_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const auto dim = context_parallel_dim(s, kSequenceForward, chosen);
  return dim ? sequence_forward_form(s, chosen, *dim) : empty_queries.graph_form(s, chosen);
}

GraphForm flash_backward_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const auto dim = context_parallel_dim(s, kSequenceBackward, chosen);
  return dim ? sequence_backward_form(s, chosen, *dim) : empty_queries.graph_form(s, chosen);
}

// Which kernel single-device dispatch would run: decided on stand-ins with the global shapes (only
// the last dim's stride, which the choice checks, is real), so every rank chooses alike.
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  auto stand_in = [](const at::Tensor& t) {
    std::vector<int64_t> strides(static_cast<size_t>(t.dim()), 0);
    if (!strides.empty()) strides.back() = 1;
    return at::empty_strided(t.sizes(), strides, t.options());
  };
  std::optional<at::Tensor> mask;
  if (attn_mask && attn_mask->defined()) mask = stand_in(*attn_mask);
  return at::_fused_sdp_choice(stand_in(query), stand_in(key), stand_in(value), mask, dropout_p, is_causal, scale,
                               enable_gqa);
}

const bool attention_rules_registered = [] {
  using detail::register_overloads;
  register_overloads({"aten::_scaled_dot_product_flash_attention_for_cpu"},
                     {.mesh = [](const OpSchema& s) { return keep_heads_paired(s, kForward, sequence_over_the_mesh(s, kSequenceForward, flash_forward(s))); },
                      .local_kernel = flash_forward_kernel,
                      .graph_form = flash_forward_form,
                      .output_metas = flash_forward_metas,
                      .family = "attention",
                      .strided_shards = detail::StridedShards::HeadTailIndexWise});
  register_overloads({"aten::_scaled_dot_product_flash_attention_for_cpu_backward"},
                     {.mesh = [](const OpSchema& s) { return keep_heads_paired(s, kBackward, sequence_over_the_mesh(s, kSequenceBackward, flash_backward(s))); },
                      .local_kernel = flash_backward_kernel,
                      .graph_form = flash_backward_form,
                      .output_metas = flash_backward_metas,
                      .family = "attention",
                      .strided_shards = detail::StridedShards::HeadTailIndexWise});
  detail::register_composite({"aten::scaled_dot_product_attention"},
                             {.dim = [](const OpSchema& s) { return forward(s, kComposite); }, .family = "composite"});
  return true;
}();

}  // namespace

Placement attention_mask_placement(const OpSchema& s, size_t input, int64_t dim) {
  const Shape& mask = s.input(input).meta.shape;
  const int64_t d = dim - (4 - static_cast<int64_t>(mask.size()));
  const size_t query = *s.input_at_arg(0);
  return d >= 0 && mask[d] == s.input(query).meta.shape[dim] && mask[d] != 1 ? Placement(Shard(d)) : Replicate();
}

// A DTensor's sizes are global, so the choice sees what single-device dispatch sees.
TORCH_LIBRARY_IMPL(aten, PrivateUse2, m) { m.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice)); }

}  // namespace dtensor::rules
