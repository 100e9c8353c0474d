// What both methods share: checks, layouts, the sequence's runs, and the CPU flash kernel's backward
// adding into given gradients (add_flash_attention_backward, below).
#include "context_attention.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#if defined(HAVE_AVX2_CPU_DEFINITION)
#include <ATen/native/transformers/attention.h>
#endif

#include <string>
#include <utility>
#include <vector>

#include "dtensor/errors.h"
#include "dtensor/layout.h"

namespace dtensor::detail {

void check_context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextAttention& call, const char* method) {
  const int64_t ranks = call.mesh->size(call.dim), rank = call.mesh->local_rank(call.dim);
  const std::string where = std::string(" (") + method + " over " + call.mesh->dim_label(call.dim) + ", rank " + std::to_string(rank) +
                            " of " + std::to_string(ranks) + ")";
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    throw DTensorError("context-parallel attention: query, key and value must be [batch, heads, positions, head dim]" + where);
  const int64_t positions = chunk_extent(call.length, ranks, rank).size;
  if (k.size(2) != q.size(2) || v.size(2) != q.size(2) || q.size(2) != positions)
    throw DTensorError("context-parallel attention: this rank holds " + std::to_string(q.size(2)) + " query, " + std::to_string(k.size(2)) +
                       " key and " + std::to_string(v.size(2)) + " value positions, but its block of " + std::to_string(call.length) + " has " +
                       std::to_string(positions) + where + ": shard all three alike along the sequence");
  if (k.size(1) != v.size(1) || q.size(1) % k.size(1) != 0)
    throw DTensorError("context-parallel attention: " + std::to_string(q.size(1)) + " query heads over " + std::to_string(k.size(1)) +
                       " key and " + std::to_string(v.size(1)) + " value heads" + where + ": keys and values need the same heads, dividing the queries'");
}

namespace {

at::Tensor laid_out_as(const at::Tensor& t, at::Tensor target) {
  return t.strides() == target.strides() ? t : target.copy_(t);
}

}  // namespace

at::Tensor laid_out_like_queries(const at::Tensor& t, const at::Tensor& q) { return laid_out_as(t, at::empty_like(q, t.options())); }

at::Tensor empty_heads_last(at::IntArrayRef sizes, const at::TensorOptions& options) {
  std::vector<int64_t> order(sizes.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int64_t>(d);
  std::swap(order[1], order[2]);
  return at::empty_permuted(sizes, order, options);
}

at::Tensor laid_out_heads_last(const at::Tensor& t) { return laid_out_as(t, empty_heads_last(t.sizes(), t.options())); }

namespace {

std::string label(const ContextAttention& call) { return "context-parallel attention over " + call.mesh->dim_label(call.dim); }

}  // namespace

std::vector<SequenceRun> sequence_runs(const ContextAttention& call, int64_t rank) {
  return dtensor::sequence_runs(call.length, call.mesh->size(call.dim), rank, call.load_balanced, label(call));
}

std::vector<int64_t> sequence_order_of_blocks(const ContextAttention& call) {
  return dtensor::sequence_order_of_blocks(call.length, call.mesh->size(call.dim), call.load_balanced, label(call));
}

// ---- The CPU flash kernel's backward, adding ---------------------------------------------------
//
// ATen's CPU flash-attention backward kernel, called directly so that it adds into gradients the caller
// holds. The kernel itself accumulates into its gradient buffers (every product is added with beta 1;
// the ATen op only hands it zeros), so passes over parts of the heads can share one set of buffers
// instead of each allocating its own and adding them up afterwards.
// tests/unit/flash_attention_backward_test.cpp holds LibTorch to that: a version whose kernel overwrote
// the buffers would fail it.
//
// The kernel is an ATen DispatchStub, whose declaration depends on the CPU capabilities LibTorch was
// built with: CMakeLists.txt defines them, for this file's unity batch, as PyPI's x86-64 LibTorch has
// them (AVX2, AVX512). A mismatch cannot run wrongly: the stub's lookup function then has another
// signature, and a program linking libdtensor fails to link. Elsewhere (no definitions) the op's own
// gradients are added, which costs their allocation.

namespace {

std::string described(const at::Tensor& t) { return std::string(t.toString()) + " " + c10::str(t.sizes()) + " with strides " + c10::str(t.strides()); }

// What the kernel reads by pointer and strides: CPU tensors whose last dim is dense.
void check_readable(const at::Tensor& t, const char* name) {
  if (t.device().type() != at::kCPU || t.stride(-1) != 1)
    throw DTensorError(std::string("add_flash_attention_backward: the ") + name + " must be a CPU tensor with a dense last dim, but is " +
                       described(t));
}

void check_gradient_buffer(const at::Tensor& grad, const at::Tensor& like, const char* name) {
  check_readable(grad, name);
  if (!grad.sizes().equals(like.sizes()) || grad.scalar_type() != like.scalar_type())
    throw DTensorError(std::string("add_flash_attention_backward: the ") + name + " must be sized and typed like its input " +
                       described(like) + ", but is " + described(grad));
}

}  // namespace

void add_flash_attention_backward(const FlashGradients& grads, const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool is_causal,
                                  std::optional<double> scale) {
  check_readable(q, "query");
  check_readable(k, "key");
  check_readable(v, "value");
  check_readable(out, "output");
  check_gradient_buffer(grads.q, q, "query gradient's buffer");
  check_gradient_buffer(grads.k, k, "key gradient's buffer");
  check_gradient_buffer(grads.v, v, "value gradient's buffer");
  if (lse.scalar_type() != at::toOpMathType(q.scalar_type()))
    throw DTensorError("add_flash_attention_backward: the logsumexp must be " + std::string(c10::toString(at::toOpMathType(q.scalar_type()))) +
                       " for " + c10::toString(q.scalar_type()) + " queries, but is " + described(lse));
#if defined(HAVE_AVX2_CPU_DEFINITION)
  // The kernel's layout: [batch, positions, heads, head dim]. It makes grad_out contiguous itself.
  const auto t = [](const at::Tensor& x) { return x.transpose(1, 2); };
  at::native::flash_attention_backward_kernel(at::kCPU, t(grads.q), t(grads.k), t(grads.v), t(grad_out), t(q), t(k), t(v), t(out), t(lse), 0.0,
                                              is_causal, std::nullopt, scale);
#else
  const auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, 0.0, is_causal, {}, scale);
  grads.q.add_(dq);
  grads.k.add_(dk);
  grads.v.add_(dv);
#endif
}

}  // namespace dtensor::detail
