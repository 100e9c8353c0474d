#pragma once
// A training job's state as a checkpoint State: a module's parameters and buffers and its optimizer's
// per-parameter state, aliasing the live tensors, so that saving and loading need no copies by hand.
// Not in dtensor.h: torch::nn and torch::optim headers are heavy.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "dtensor/checkpoint.h"

namespace dtensor::checkpoint {

class TrainingState {
 public:
  // Names: "model.<fqn>" for parameters and buffers; for Adam and AdamW "optim.<fqn>.exp_avg",
  // ".exp_avg_sq" (".max_exp_avg_sq" with amsgrad) and ".step", for SGD with momentum
  // "optim.<fqn>.momentum_buffer". Optimizer state not made yet (before the first step) is made as the
  // first step would make it, so a fresh job can load into it. Other optimizers are refused.
  explicit TrainingState(torch::nn::Module& module, torch::optim::Optimizer* optimizer = nullptr);

  // The named tensors; add the job's own (a step counter, an RNG state) before saving or loading.
  State& tensors() { return tensors_; }

  SaveResult save(const std::string& dir, const SaveOptions& options = {});
  // Loads in place, then hands the optimizer its step counters (LibTorch keeps them as integers).
  LoadResult load(const std::string& dir, const LoadOptions& options = {});

 private:
  void steps_to_tensors();
  void steps_from_tensors();

  torch::optim::Optimizer* optimizer_;
  State tensors_;
  std::vector<std::pair<void*, std::string>> step_keys_;  // optimizer state key -> its ".step" name
};

}  // namespace dtensor::checkpoint
