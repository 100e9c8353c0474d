// step_on_local_shards: LibTorch's own optimizer step, run over plain tensors that alias the DTensor
// parameters' shards. For the length of the step every DTensor parameter is swapped, in its param
// group and as the key of its state, for a plain alias of its local shard (its gradient and state
// tensors too); afterwards everything is swapped back, and state the step made is wrapped as DTensors.

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "dtensor/api.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "dtensor/optim.h"

namespace dtensor {
namespace {

// The tensors of a parameter's state, for the optimizers whose update is elementwise; empty for any
// other state (the optimizer is refused before this matters).
std::vector<at::Tensor*> state_tensors(torch::optim::OptimizerParamState& state) {
  if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(&state))
    return {&s->exp_avg(), &s->exp_avg_sq(), &s->max_exp_avg_sq()};
  if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(&state))
    return {&s->exp_avg(), &s->exp_avg_sq(), &s->max_exp_avg_sq()};
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(&state)) return {&s->momentum_buffer()};
  return {};
}

bool elementwise(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const torch::optim::AdamW*>(&optimizer) || dynamic_cast<const torch::optim::Adam*>(&optimizer) ||
         dynamic_cast<const torch::optim::SGD*>(&optimizer);
}

using States = ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>;

// Moves a state entry to another key (the optimizer finds a parameter's state by its TensorImpl).
void rekey(States& states, void* from, void* to) {
  auto it = states.find(from);
  if (it == states.end()) return;
  auto state = std::move(it->second);
  states.erase(it);
  states[to] = std::move(state);
}

// One DTensor parameter while the step runs on its shard.
struct Swap {
  at::Tensor* slot;                     // its place in the param group
  at::Tensor param;                     // the DTensor
  at::Tensor local;                     // the plain alias of its shard, in `slot` during the step
  std::vector<at::Tensor> state_before; // its state tensors (DTensors, or undefined) before the step
};

Swap swap_in(at::Tensor& slot, States& states) {
  Swap s{&slot, slot, alias_without_history(local_tensor_of(slot)), {}};
  if (const at::Tensor& grad = s.param.grad(); grad.defined()) {
    const at::Tensor placed =
        is_dtensor(grad) && placements_of(grad) != placements_of(s.param) ? redistribute(grad, placements_of(s.param)) : grad;
    s.local.mutable_grad() = alias_without_history(local_tensor_of(placed));
  }
  if (auto it = states.find(s.param.unsafeGetTensorImpl()); it != states.end())
    for (at::Tensor* t : state_tensors(*it->second)) {
      s.state_before.push_back(*t);
      if (t->defined()) *t = alias_without_history(local_tensor_of(*t));
    }
  rekey(states, s.param.unsafeGetTensorImpl(), s.local.unsafeGetTensorImpl());
  slot = s.local;
  return s;
}

// Puts the DTensor parameter back, with its state: the DTensors it had (their shards now updated in
// place), and new state tensors wrapped as DTensors laid out like the parameter.
void swap_out(Swap& s, States& states) {
  *s.slot = s.param;
  rekey(states, s.local.unsafeGetTensorImpl(), s.param.unsafeGetTensorImpl());
  auto it = states.find(s.param.unsafeGetTensorImpl());
  if (it == states.end()) return;
  const auto fields = state_tensors(*it->second);
  for (size_t k = 0; k < fields.size(); ++k) {
    at::Tensor& field = *fields[k];
    if (k < s.state_before.size() && s.state_before[k].defined()) {
      field = s.state_before[k];
    } else if (field.defined() && !is_dtensor(field)) {
      FromLocalOptions options{.run_check = false};
      options.shape = s.param.sizes().vec();
      options.stride = s.param.strides().vec();
      field = from_local(field, mesh_of(s.param), placements_of(s.param), options);
    }
  }
}

}  // namespace

void step_on_local_shards(torch::optim::Optimizer& optimizer) {
  if (!elementwise(optimizer))
    throw DTensorError("step_on_local_shards supports Adam, AdamW and SGD, whose updates are elementwise; this "
                       "optimizer's step may mix the elements of a parameter, so call optimizer.step() on the "
                       "DTensor parameters instead");
  at::NoGradGuard no_grad;
  States& states = optimizer.state();
  std::vector<Swap> swaps;
  try {
    for (auto& group : optimizer.param_groups())
      for (at::Tensor& slot : group.params())
        if (is_dtensor(slot)) swaps.push_back(swap_in(slot, states));
    optimizer.step();
  } catch (...) {
    for (Swap& s : swaps) swap_out(s, states);
    throw;
  }
  for (Swap& s : swaps) swap_out(s, states);
}

}  // namespace dtensor
