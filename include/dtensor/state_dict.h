#pragma once
// PyTorch's torch.distributed.checkpoint.state_dict for C++: a module's and its optimizer's state as
// named tensors in memory, sharded (the DTensors as they live) or full (whole tensors), and set back
// from either onto whatever mesh and placements the module has now (another TP degree, FSDP, one
// process). Not in dtensor.h: torch::nn and torch::optim headers are heavy.
//
// Model entries are named by their path in the module ("layers.0.weight"). Optimizer entries (Adam,
// AdamW, SGD with momentum, as TrainingState) are PyTorch's {"state": {fqn: {...}}} flattened: the
// parameter's path and the state's name ("layers.0.weight.exp_avg", ".exp_avg_sq", ".step";
// ".momentum_buffer"). Departure: no "param_groups" (learning rates, betas, ...) in these dicts: in C++
// they are the optimizer's options. set_param_groups sets them from what a PyTorch checkpoint holds.
//
// Collective where DTensors are gathered or moved: every rank calls with the same names.

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/checkpoint.h"

namespace dtensor::checkpoint {

struct StateDictOptions {
  // get: whole tensors (each DTensor gathered, full_tensor) instead of the DTensors themselves.
  // set: the dict holds whole tensors. In both modes set also takes DTensors of any layout and mesh
  // of the same world, moved to the module's layout.
  bool full_state_dict = false;
  // get: every tensor in host memory. On a CPU mesh they are there already; a sharded (not full)
  // DTensor on another device is refused (ask for a full state dict).
  bool cpu_offload = false;
  // set, with full_state_dict: only rank 0's dict is read (the others may pass an empty one); its
  // tensors are broadcast over the world (one process group made for it), its keys checked on rank 0
  // and any error raised on every rank.
  bool broadcast_from_rank0 = false;
  // set: every entry must be given and no other; without it the missing ones keep their values and
  // both kinds are returned.
  bool strict = true;
};

using StateDict = std::map<std::string, at::Tensor>;

struct IncompatibleKeys {
  std::vector<std::string> missing;     // entries of the module (optimizer) the dict does not give
  std::vector<std::string> unexpected;  // names in the dict that are none of its entries
};

StateDict get_model_state_dict(torch::nn::Module& module, const StateDictOptions& options = {});
StateDict get_optimizer_state_dict(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                   const StateDictOptions& options = {});
// {model, optimizer}.
std::pair<StateDict, StateDict> get_state_dict(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                               const StateDictOptions& options = {});

// In place, without autograd; shapes must match the entries' global shapes (dtypes are converted, as
// load_state_dict's copy_ converts them). Throws DTensorError naming the entry.
IncompatibleKeys set_model_state_dict(torch::nn::Module& module, const StateDict& state, const StateDictOptions& options = {});
IncompatibleKeys set_optimizer_state_dict(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const StateDict& state,
                                          const StateDictOptions& options = {});
IncompatibleKeys set_state_dict(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const StateDict& model_state,
                                const StateDict& optimizer_state, const StateDictOptions& options = {});

// A PyTorch optimizer's param_groups as DCP keeps them: bytes entries "<prefix><i>.<option>"
// (dcp::read_objects reads them; a trainer's {"model", "optim"} save puts them under
// "optim.param_groups."). Group i's "params" must name, in order, the paths in `module` of
// optimizer.param_groups()[i]'s parameters; its options become that group's: lr, betas, eps,
// weight_decay and amsgrad for Adam and AdamW; lr, momentum, dampening, weight_decay and nesterov for
// SGD. PyTorch's implementation switches (foreach, fused, capturable, differentiable) and an LR
// scheduler's initial_lr are ignored.
// Refused, with the entry named, leaving the optimizer as it was: a missing option or one LibTorch's
// optimizer lacks, a value of another type, maximize = True, an Adam saved into an AdamW or the
// reverse (decoupled_weight_decay), groups the optimizer does not have.
void set_param_groups(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const std::map<std::string, c10::IValue>& entries,
                      const std::string& prefix = "optim.param_groups.");

}  // namespace dtensor::checkpoint
