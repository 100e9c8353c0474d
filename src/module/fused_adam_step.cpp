#include "fused_adam_step.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <map>

namespace dtensor::detail {
namespace {

bool kernel_takes(const at::Tensor& t, const at::Tensor& param) {
  return !t.defined() || (t.is_contiguous() && t.scalar_type() == param.scalar_type() && t.device() == param.device());
}

template <class State>
bool kernel_takes_all(torch::optim::Optimizer& optimizer) {
  for (const auto& group : optimizer.param_groups())
    for (const at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!at::isFloatingType(p.scalar_type()) || !p.is_contiguous() || !kernel_takes(p.grad(), p)) return false;
      const auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      if (it == optimizer.state().end()) continue;
      const auto& s = static_cast<const State&>(*it->second);
      if (!kernel_takes(s.exp_avg(), p) || !kernel_takes(s.exp_avg_sq(), p) || !kernel_takes(s.max_exp_avg_sq(), p))
        return false;
    }
  return true;
}

// One param group's tensors for the kernel, its state made (as LibTorch's first step makes it) and
// its step counted.
struct KernelLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

template <class State>
KernelLists collect(torch::optim::Optimizer& optimizer, const torch::optim::OptimizerParamGroup& group, bool amsgrad) {
  KernelLists lists;
  // The kernel only reads a step; parameters at the same step share one scalar tensor.
  std::map<int64_t, at::Tensor> step_tensors;
  for (const at::Tensor& p : group.params()) {
    if (!p.grad().defined()) continue;
    auto& slot = optimizer.state()[p.unsafeGetTensorImpl()];
    if (!slot) {
      auto state = std::make_unique<State>();
      state->step(0);
      state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
      state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      if (amsgrad) state->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      slot = std::move(state);
    }
    auto& state = static_cast<State&>(*slot);
    state.step(state.step() + 1);
    auto [it, made] = step_tensors.try_emplace(state.step());
    if (made) it->second = at::scalar_tensor(static_cast<double>(state.step()), at::TensorOptions(at::kFloat).device(p.device()));
    lists.params.push_back(p);
    lists.grads.push_back(p.grad());
    lists.exp_avgs.push_back(state.exp_avg());
    lists.exp_avg_sqs.push_back(state.exp_avg_sq());
    if (amsgrad) lists.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
    lists.steps.push_back(it->second);
  }
  return lists;
}

template <class Options, class State, class Kernel>
void fused_step(torch::optim::Optimizer& optimizer, Kernel kernel) {
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    const KernelLists l = collect<State>(optimizer, group, o.amsgrad());
    if (l.params.empty()) continue;
    kernel(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps, o.lr(), std::get<0>(o.betas()),
           std::get<1>(o.betas()), o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, std::nullopt, std::nullopt);
    // The fused kernels write in place without counting it in the tensors' versions (as in PyTorch 2.15);
    // count it, so that whoever checks them (fully_shard's gathered values, autograd) sees the change.
    for (const auto* list : {&l.params, &l.exp_avgs, &l.exp_avg_sqs, &l.max_exp_avg_sqs})
      for (const at::Tensor& t : *list) t.unsafeGetTensorImpl()->bump_version();
  }
}

}  // namespace

bool try_fused_adam_step(torch::optim::Optimizer& optimizer) {
  at::NoGradGuard no_grad;
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
    if (!kernel_takes_all<torch::optim::AdamWParamState>(optimizer)) return false;
    fused_step<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
        optimizer, [](auto&&... args) { at::_fused_adamw_(args...); });
    return true;
  }
  if (dynamic_cast<torch::optim::Adam*>(&optimizer)) {
    if (!kernel_takes_all<torch::optim::AdamParamState>(optimizer)) return false;
    fused_step<torch::optim::AdamOptions, torch::optim::AdamParamState>(
        optimizer, [](auto&&... args) { at::_fused_adam_(args...); });
    return true;
  }
  return false;
}

}  // namespace dtensor::detail
