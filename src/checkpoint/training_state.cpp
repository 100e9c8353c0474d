#include "dtensor/training_state.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <set>

#include "dtensor/errors.h"

namespace dtensor::checkpoint {
namespace {

std::string entry(const std::string& param, const char* what) { return "optim." + param + "." + what; }

// The optimizer's state for `p`, or null before its first step.
torch::optim::OptimizerParamState* state_of(torch::optim::Optimizer& optimizer, const at::Tensor& p) {
  const auto it = optimizer.state().find(p.unsafeGetTensorImpl());
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

// Adam's and AdamW's states have the same fields but no common base: one template serves both.
template <typename S>
void add_adam_entries(S* live, const at::Tensor& p, const std::string& name, bool amsgrad, State& out) {
  out[entry(name, "exp_avg")] = live ? live->exp_avg() : at::zeros_like(p);
  out[entry(name, "exp_avg_sq")] = live ? live->exp_avg_sq() : at::zeros_like(p);
  if (amsgrad) out[entry(name, "max_exp_avg_sq")] = live ? live->max_exp_avg_sq() : at::zeros_like(p);
  // 0-d, as PyTorch keeps it (as float32 there; a load converts).
  out[entry(name, "step")] = at::scalar_tensor(live ? live->step() : int64_t{0}, at::kLong);
}

template <typename S>
void adopt_adam(torch::optim::Optimizer& optimizer, S* live, const at::Tensor& p, const std::string& name, bool amsgrad,
                const State& loaded) {
  const int64_t step = loaded.at(entry(name, "step")).template item<int64_t>();
  if (live) {
    live->step(step);  // the moments were loaded in place
    return;
  }
  auto made = std::make_unique<S>();
  made->step(step);
  made->exp_avg(loaded.at(entry(name, "exp_avg")));
  made->exp_avg_sq(loaded.at(entry(name, "exp_avg_sq")));
  if (amsgrad) made->max_exp_avg_sq(loaded.at(entry(name, "max_exp_avg_sq")));
  optimizer.state()[p.unsafeGetTensorImpl()] = std::move(made);
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
      Slot slot{found->second, p, Kind::SGD};
      if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&group.options())) {
        slot.kind = Kind::AdamW;
        slot.amsgrad = adamw->amsgrad();
      } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&group.options())) {
        slot.kind = Kind::Adam;
        slot.amsgrad = adam->amsgrad();
      } else if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&group.options())) {
        if (sgd->momentum() == 0) continue;  // no state
      } else {
        throw DTensorError("checkpoint::TrainingState: only Adam, AdamW and SGD optimizers are supported");
      }
      slots_.push_back(std::move(slot));
    }
  }
}

State TrainingState::with_optimizer(const std::function<bool(const std::string&)>* stored) const {
  State out = tensors_;
  for (const Slot& s : slots_) {
    auto* live = state_of(*optimizer_, s.param);
    switch (s.kind) {
      case Kind::AdamW:
        add_adam_entries(static_cast<torch::optim::AdamWParamState*>(live), s.param, s.name, s.amsgrad, out);
        break;
      case Kind::Adam:
        add_adam_entries(static_cast<torch::optim::AdamParamState*>(live), s.param, s.name, s.amsgrad, out);
        break;
      case Kind::SGD:
        if (live) out[entry(s.name, "momentum_buffer")] = static_cast<torch::optim::SGDParamState*>(live)->momentum_buffer();
        else if (stored && (*stored)(entry(s.name, "momentum_buffer")))
          out[entry(s.name, "momentum_buffer")] = at::zeros_like(s.param);
        break;
    }
  }
  return out;
}

void TrainingState::adopt_loaded(const State& state, const LoadResult& result) {
  const auto loaded = [&](const std::string& name) {
    return state.count(name) && std::find(result.missing.begin(), result.missing.end(), name) == result.missing.end();
  };
  for (const Slot& s : slots_) {
    auto* live = state_of(*optimizer_, s.param);
    if (s.kind == Kind::SGD) {
      if (!live && loaded(entry(s.name, "momentum_buffer"))) {
        auto made = std::make_unique<torch::optim::SGDParamState>();
        made->momentum_buffer(state.at(entry(s.name, "momentum_buffer")));
        optimizer_->state()[s.param.unsafeGetTensorImpl()] = std::move(made);
      }
      continue;
    }
    if (!loaded(entry(s.name, "step"))) continue;
    if (s.kind == Kind::AdamW)
      adopt_adam(*optimizer_, static_cast<torch::optim::AdamWParamState*>(live), s.param, s.name, s.amsgrad, state);
    else
      adopt_adam(*optimizer_, static_cast<torch::optim::AdamParamState*>(live), s.param, s.name, s.amsgrad, state);
  }
}

SaveResult TrainingState::save(const std::string& dir, const SaveOptions& options) {
  return checkpoint::save(optimizer_ ? with_optimizer(nullptr) : tensors_, dir, options);
}

std::future<SaveResult> TrainingState::save_async(const std::string& dir, const SaveOptions& options) {
  return checkpoint::save_async(optimizer_ ? with_optimizer(nullptr) : tensors_, dir, options);
}

LoadResult TrainingState::load(const std::string& dir, const LoadOptions& options) {
  if (!optimizer_) return checkpoint::load(tensors_, dir, options);
  const auto stored = contents(dir);
  const std::function<bool(const std::string&)> in_checkpoint = [&](const std::string& name) { return stored.count(name) > 0; };
  const State state = with_optimizer(&in_checkpoint);
  const LoadResult result = checkpoint::load(state, dir, options);
  adopt_loaded(state, result);
  return result;
}

State TrainingState::entries() const { return optimizer_ ? with_optimizer(nullptr) : tensors_; }

void TrainingState::load_with(const std::vector<std::string>& names, const Fill& fill) {
  const std::set<std::string> given(names.begin(), names.end());
  const std::function<bool(const std::string&)> is_given = [&](const std::string& name) { return given.count(name) > 0; };
  const State state = optimizer_ ? with_optimizer(&is_given) : tensors_;
  LoadResult result;
  result.missing = fill(state);
  if (optimizer_) adopt_loaded(state, result);
}

}  // namespace dtensor::checkpoint
