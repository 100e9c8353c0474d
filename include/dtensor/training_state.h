#pragma once
// A training job's state as a checkpoint State: a module's parameters and buffers and its optimizer's
// per-parameter state, aliasing the live tensors, so that saving and loading need no copies by hand.
// Not in dtensor.h: torch::nn and torch::optim headers are heavy.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>

#include "dtensor/checkpoint.h"

namespace dtensor::checkpoint {

class TrainingState {
 public:
  // Names: "model.<fqn>" for parameters and buffers; for Adam and AdamW "optim.<fqn>.exp_avg",
  // ".exp_avg_sq" (".max_exp_avg_sq" with amsgrad) and ".step"; for SGD with momentum
  // "optim.<fqn>.momentum_buffer". The optimizer is read at each save and load (its state appears at
  // its first step), never changed by building this. Optimizers other than Adam, AdamW and SGD are
  // refused.
  explicit TrainingState(torch::nn::Module& module, torch::optim::Optimizer* optimizer = nullptr);

  // The module's tensors and any the job adds (a step counter, an RNG state); "optim." names are the
  // optimizer's.
  State& tensors() { return tensors_; }

  // Adam/AdamW state not made yet is saved as the first step would make it (zero moments, step 0); SGD
  // momentum not made yet is left out (LibTorch starts it from the first gradient, not from zero).
  SaveResult save(const std::string& dir, const SaveOptions& options = {});
  // checkpoint::save_async of the same: training may go on as soon as it returns.
  std::future<SaveResult> save_async(const std::string& dir, const SaveOptions& options = {});
  // Loads in place; optimizer state the checkpoint holds but the optimizer has not made yet is made
  // from it, and the step counters are handed back (LibTorch keeps them as integers).
  LoadResult load(const std::string& dir, const LoadOptions& options = {});

  // What save writes, by name: tensors() and the optimizer's entries (made as save makes them).
  State entries() const;
  // A load from somewhere else than a directory (state dicts in memory, state_dict.h): `fill` gets the
  // entries a load of `names` fills (optimizer state not made yet is made fresh for the names given)
  // and returns those it did not fill; the optimizer then adopts what it filled, as load does.
  using Fill = std::function<std::vector<std::string>(const State& entries)>;
  void load_with(const std::vector<std::string>& names, const Fill& fill);

 private:
  enum class Kind { Adam, AdamW, SGD };
  struct Slot {
    std::string name;  // the parameter's fqn
    at::Tensor param;
    Kind kind;
    bool amsgrad = false;
  };
  // tensors_ plus the optimizer's entries; `stored` (for a load) says which SGD buffers to expect.
  State with_optimizer(const std::function<bool(const std::string&)>* stored) const;
  void adopt_loaded(const State& state, const LoadResult& result);

  torch::optim::Optimizer* optimizer_;
  State tensors_;
  std::vector<Slot> slots_;
};

}  // namespace dtensor::checkpoint
