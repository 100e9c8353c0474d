// dtensor::moe_experts differentiable (src/sharding/rules/experts.cpp defines it): its backward is
// dtensor::moe_experts_backward, so that code run eagerly on DTensors (a program run by graph::run
// after graph::distribute_program, as a PyTorch model runs after parallelize_module) trains through the
// experts ops with the strategies graph programs get, each rank's own experts included. For every
// autograd key, plain tensors too.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <tuple>

namespace dtensor::rules {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ExpertsSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&);
using ExpertsBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&);

struct ExpertsFunction : torch::autograd::Function<ExpertsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights,
                            const at::Tensor& gate_up, const at::Tensor& down) {
    ctx->save_for_backward({hidden, experts, weights, gate_up, down});
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("dtensor::moe_experts", "").typed<ExpertsSignature>();
    const at::AutoDispatchBelowADInplaceOrView below_autograd;  // to the DTensor rule or the CPU kernel
    return op.call(hidden, experts, weights, gate_up, down);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("dtensor::moe_experts_backward", "").typed<ExpertsBackwardSignature>();
    const variable_list in = ctx->get_saved_variables();
    auto [hidden, weights, gate_up, down] = op.call(grads[0], in[0], in[1], in[2], in[3], in[4]);
    return {hidden, at::Tensor(), weights, gate_up, down};  // the chosen experts are indices: no gradient
  }
};

at::Tensor differentiable_experts(const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights, const at::Tensor& gate_up,
                                  const at::Tensor& down) {
  return ExpertsFunction::apply(hidden, experts, weights, gate_up, down);
}

}  // namespace

TORCH_LIBRARY_IMPL(dtensor, Autograd, m) { m.impl("moe_experts", TORCH_FN(differentiable_experts)); }

}  // namespace dtensor::rules
