// ATen's CPU flash-attention backward kernel, called directly so that it adds into gradients the caller
// holds. The kernel itself accumulates into its gradient buffers (every product is added with beta 1;
// the ATen op only hands it zeros), so passes over parts of the heads can share one set of buffers
// instead of each allocating its own and adding them up afterwards.
// tests/unit/flash_attention_backward_test.cpp holds LibTorch to that: a version whose kernel overwrote
// the buffers would fail it.
//
// The kernel is an ATen DispatchStub, whose declaration depends on the CPU capabilities LibTorch was
// built with: CMakeLists.txt defines them for this file as PyPI's x86-64 LibTorch has them (AVX2,
// AVX512). A mismatch cannot run wrongly: the stub's lookup function then has another signature, and
// linking fails.

#include <ATen/ATen.h>
#include <ATen/native/transformers/attention.h>

#include <string>

#include "context_attention.h"
#include "dtensor/errors.h"

namespace dtensor::detail {
namespace {

void check_gradient_buffer(const at::Tensor& grad, const at::Tensor& like, const char* name) {
  if (!grad.sizes().equals(like.sizes()) || grad.scalar_type() != like.scalar_type() || grad.stride(-1) != 1)
    throw DTensorError(std::string("add_flash_attention_backward: the ") + name + " gradient's buffer must be sized, typed and laid out " +
                       "(last dim dense) like its input, but is " + std::string(grad.toString()) + " " + c10::str(grad.sizes()) +
                       " against " + c10::str(like.sizes()));
}

}  // namespace

void add_flash_attention_backward(const FlashGradients& grads, const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool is_causal,
                                  std::optional<double> scale) {
  check_gradient_buffer(grads.q, q, "query");
  check_gradient_buffer(grads.k, k, "key");
  check_gradient_buffer(grads.v, v, "value");
  // The kernel's layout: [batch, positions, heads, head dim].
  const auto t = [](const at::Tensor& x) { return x.transpose(1, 2); };
  at::native::flash_attention_backward_kernel(at::kCPU, t(grads.q), t(grads.k), t(grads.v), t(grad_out), t(q), t(k), t(v), t(out), t(lse), 0.0,
                                              is_causal, std::nullopt, scale);
}

}  // namespace dtensor::detail
