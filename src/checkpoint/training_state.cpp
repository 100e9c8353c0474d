#include "dtensor/training_state.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "dtensor/errors.h"

namespace dtensor::checkpoint {
namespace {

// The optimizer's state for `p`, made as its first step would when it does not exist yet.
template <typename ParamState, typename Options>
ParamState& state_for(torch::optim::Optimizer& optimizer, const at::Tensor& p, const Options& options) {
  auto& states = optimizer.state();
  auto& slot = states[p.unsafeGetTensorImpl()];
  if (!slot) {
    auto made = std::make_unique<ParamState>();
    if constexpr (std::is_same_v<ParamState, torch::optim::SGDParamState>) {
      made->momentum_buffer(at::zeros_like(p));
    } else {
      made->step(0);
      made->exp_avg(at::zeros_like(p));
      made->exp_avg_sq(at::zeros_like(p));
      if (options.amsgrad()) made->max_exp_avg_sq(at::zeros_like(p));
    }
    slot = std::move(made);
  }
  return static_cast<ParamState&>(*slot);
}

template <typename ParamState, typename Options>
void add_adam_state(torch::optim::Optimizer& optimizer, const std::string& name, const at::Tensor& p,
                    const Options& options, State& out) {
  auto& s = state_for<ParamState>(optimizer, p, options);
  out["optim." + name + ".exp_avg"] = s.exp_avg();
  out["optim." + name + ".exp_avg_sq"] = s.exp_avg_sq();
  if (options.amsgrad()) out["optim." + name + ".max_exp_avg_sq"] = s.max_exp_avg_sq();
}

}  // namespace

TrainingState::TrainingState(torch::nn::Module& module, torch::optim::Optimizer* optimizer) : optimizer_(optimizer) {
  for (const auto& item : module.named_parameters()) tensors_["model." + item.key()] = item.value();
  for (const auto& item : module.named_buffers()) tensors_["model." + item.key()] = item.value();
  if (!optimizer_) return;
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : module.named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
  for (auto& group : optimizer_->param_groups()) {
    for (const at::Tensor& p : group.params()) {
      const auto found = names.find(p.unsafeGetTensorImpl());
      if (found == names.end())
        throw DTensorError("checkpoint::TrainingState: the optimizer steps a parameter that is not in the module; "
                           "give the module that owns every parameter it steps");
      const std::string& name = found->second;
      if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&group.options())) {
        add_adam_state<torch::optim::AdamWParamState>(*optimizer_, name, p, *adamw, tensors_);
      } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&group.options())) {
        add_adam_state<torch::optim::AdamParamState>(*optimizer_, name, p, *adam, tensors_);
      } else if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&group.options())) {
        if (sgd->momentum() != 0)
          tensors_["optim." + name + ".momentum_buffer"] =
              state_for<torch::optim::SGDParamState>(*optimizer_, p, *sgd).momentum_buffer();
        continue;
      } else {
        throw DTensorError("checkpoint::TrainingState: only Adam, AdamW and SGD optimizers are supported");
      }
      tensors_["optim." + name + ".step"] = at::zeros({}, at::kLong);
      step_keys_.emplace_back(p.unsafeGetTensorImpl(), "optim." + name + ".step");
    }
  }
}

void TrainingState::steps_to_tensors() {
  for (const auto& [key, name] : step_keys_) {
    const auto& s = optimizer_->state().at(key);
    const int64_t step = dynamic_cast<torch::optim::AdamWParamState*>(s.get())
                             ? static_cast<torch::optim::AdamWParamState&>(*s).step()
                             : static_cast<torch::optim::AdamParamState&>(*s).step();
    tensors_.at(name).fill_(step);
  }
}

void TrainingState::steps_from_tensors() {
  for (const auto& [key, name] : step_keys_) {
    const int64_t step = tensors_.at(name).item<int64_t>();
    auto& s = optimizer_->state().at(key);
    if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(s.get())) adamw->step(step);
    else static_cast<torch::optim::AdamParamState&>(*s).step(step);
  }
}

SaveResult TrainingState::save(const std::string& dir, const SaveOptions& options) {
  steps_to_tensors();
  return checkpoint::save(tensors_, dir, options);
}

LoadResult TrainingState::load(const std::string& dir, const LoadOptions& options) {
  steps_to_tensors();  // a tensor left out of a non-strict load keeps the current step
  LoadResult result = checkpoint::load(tensors_, dir, options);
  steps_from_tensors();
  return result;
}

}  // namespace dtensor::checkpoint
