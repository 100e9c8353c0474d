// step_on_local_shards: LibTorch's own optimizer step, run over plain tensors that alias the DTensor
// parameters' shards. For the length of the step every DTensor parameter is swapped, in its param
// group and as the key of its state, for a plain alias of its local shard (its gradient and state
// tensors too); afterwards everything is swapped back, and state the step made is wrapped as DTensors.

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <unordered_map>

#include "dtensor/api.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "dtensor/optim.h"
#include "fsdp_group.h"
#include "fused_adam_step.h"

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

// `t` (a gradient or a state tensor of `param`) placed as the parameter is, so that the elementwise
// update meets matching shards: a state tensor made from a Partial gradient by an earlier plain step
// is Partial, and is reduced here for good.
at::Tensor placed_like(const at::Tensor& t, const at::Tensor& param) {
  if (!t.defined() || !is_dtensor(t) || placements_of(t) == placements_of(param)) return t;
  return redistribute(t, placements_of(param));
}

// One DTensor parameter while the step runs on its shard.
struct Swap {
  std::vector<at::Tensor*> slots;  // its places in the param groups (one parameter may be listed twice)
  at::Tensor param;                // the DTensor
  at::Tensor local;                // the plain alias of its shard, in its slots during the step
  std::vector<at::Tensor> state;   // its state tensors (DTensors placed as the parameter, or undefined)
};

// Refuses, before anything is swapped, what the step on shards cannot do as the DTensor step would.
void check_steppable(const at::Tensor& param, const States& states) {
  for (const Placement& p : placements_of(param))
    if (p.is_partial())
      throw DTensorError("step_on_local_shards: a parameter is Partial (" + to_string(placements_of(param)) +
                         "); updates that are not linear (Adam's squared gradients) need its value: redistribute it to "
                         "Replicate first, or call optimizer.step()");
  auto it = states.find(param.unsafeGetTensorImpl());
  if (it == states.end()) return;
  for (at::Tensor* t : state_tensors(*it->second))
    if (t->defined() && !is_dtensor(*t))
      throw DTensorError("step_on_local_shards: a DTensor parameter's optimizer state holds a plain tensor; load or "
                         "create its state as DTensors (as optimizer.step() does), or call optimizer.step()");
}

Swap swap_in(at::Tensor& slot, States& states) {
  Swap s{{&slot}, slot, alias_without_history(local_tensor_of(slot)), {}};
  // Everything that may fail (redistributions) before anything changes.
  const at::Tensor grad = placed_like(s.param.grad(), s.param);
  auto it = states.find(s.param.unsafeGetTensorImpl());
  const std::vector<at::Tensor*> fields = it == states.end() ? std::vector<at::Tensor*>{} : state_tensors(*it->second);
  for (at::Tensor* t : fields) s.state.push_back(placed_like(*t, s.param));
  if (grad.defined()) s.local.mutable_grad() = alias_without_history(local_tensor_of(grad));
  for (size_t k = 0; k < fields.size(); ++k)
    if (s.state[k].defined()) *fields[k] = alias_without_history(local_tensor_of(s.state[k]));
  rekey(states, s.param.unsafeGetTensorImpl(), s.local.unsafeGetTensorImpl());
  slot = s.local;
  return s;
}

// Puts the DTensor parameter back, with its state: the DTensors it had (their shards now updated in
// place), and new state tensors wrapped as DTensors laid out like the parameter.
void swap_out(Swap& s, States& states) {
  for (at::Tensor* slot : s.slots) *slot = s.param;
  rekey(states, s.local.unsafeGetTensorImpl(), s.param.unsafeGetTensorImpl());
  auto it = states.find(s.param.unsafeGetTensorImpl());
  if (it == states.end()) return;
  const auto fields = state_tensors(*it->second);
  for (size_t k = 0; k < fields.size(); ++k) {
    at::Tensor& field = *fields[k];
    if (k < s.state.size() && s.state[k].defined()) {
      field = s.state[k];
    } else if (field.defined() && !is_dtensor(field)) {
      FromLocalOptions options{.run_check = false};
      options.shape = s.param.sizes().vec();
      options.stride = s.param.strides().vec();
      field = from_local(field, mesh_of(s.param), placements_of(s.param), options);
    }
  }
}

}  // namespace

void step_on_local_shards(torch::optim::Optimizer& optimizer, const LocalStepOptions& options) {
  if (!elementwise(optimizer))
    throw DTensorError("step_on_local_shards supports Adam, AdamW and SGD, whose updates are elementwise; this "
                       "optimizer's step may mix the elements of a parameter, so call optimizer.step() on the "
                       "DTensor parameters instead");
  at::NoGradGuard no_grad;
  States& states = optimizer.state();
  for (const auto& group : optimizer.param_groups())
    for (const at::Tensor& param : group.params()) {
      if (is_dtensor(param)) check_steppable(param, states);
      if (detail::is_gathered_fsdp_parameter(param))
        throw DTensorError("step_on_local_shards: the optimizer holds a gathered (unsharded) parameter of a "
                           "fully-sharded module, which is freed and gathered again from the shards at every "
                           "forward; make the optimizer from the module's parameters while they are sharded "
                           "(after fully_shard, not between unshard and reshard)");
    }
  std::vector<Swap> swaps;
  // A parameter listed more than once (tied weights) is swapped once, so that it keeps one state, as
  // optimizer.step() gives it.
  std::unordered_map<const void*, size_t> swapped;
  try {
    for (auto& group : optimizer.param_groups())
      for (at::Tensor& slot : group.params()) {
        if (!is_dtensor(slot)) continue;
        if (auto it = swapped.find(slot.unsafeGetTensorImpl()); it != swapped.end()) {
          swaps[it->second].slots.push_back(&slot);
          slot = swaps[it->second].local;
          continue;
        }
        swapped.emplace(slot.unsafeGetTensorImpl(), swaps.size());
        swaps.push_back(swap_in(slot, states));
      }
    if (!(options.fused && detail::try_fused_adam_step(optimizer))) optimizer.step();
  } catch (...) {
    for (Swap& s : swaps) swap_out(s, states);
    throw;
  }
  for (Swap& s : swaps) swap_out(s, states);
}

}  // namespace dtensor
