// get_state_dict / set_state_dict: TrainingState's entries handed out as named tensors (whole or as
// they live), and filled from named tensors of any layout.

#include "dtensor/state_dict.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <set>
#include <sstream>

#include "dtensor/api.h"
#include "dtensor/device_mesh.h"
#include "dtensor/errors.h"
#include "dtensor/training_state.h"
#include "dtensor/world.h"

namespace dtensor::checkpoint {
namespace {

constexpr const char* kModel = "model.";
constexpr const char* kOptimizer = "optim.";

bool has_prefix(const std::string& name, const std::string& prefix) { return name.compare(0, prefix.size(), prefix) == 0; }

std::string shape_text(at::IntArrayRef shape) { return c10::str(shape); }

StateDict entries_under(const State& entries, const std::string& prefix, const StateDictOptions& options) {
  StateDict out;
  for (const auto& [name, tensor] : entries) {  // in name order, the same on every rank: gathers line up
    if (!has_prefix(name, prefix)) continue;
    at::Tensor value = tensor.detach();
    if (options.full_state_dict && is_dtensor(value)) value = full_tensor(value);
    if (options.cpu_offload && value.device().type() != c10::DeviceType::CPU) {
      if (is_dtensor(value))
        throw DTensorError("get_state_dict: '" + name.substr(prefix.size()) +
                           "' is a sharded DTensor off the host; cpu_offload needs full_state_dict for it");
      value = value.cpu();
    }
    out.emplace(name.substr(prefix.size()), std::move(value));
  }
  return out;
}

// `given` (whole, or a DTensor of any layout; problems_of checked its global shape) written into
// `target` in place.
void copy_into(const at::Tensor& target, const at::Tensor& given) {
  const torch::NoGradGuard no_grad;
  if (!is_dtensor(target)) {
    target.copy_(is_dtensor(given) ? full_tensor(given) : given);
    return;
  }
  const MeshPtr& mesh = mesh_of(target);
  at::Tensor moved;
  if (is_dtensor(given)) {
    moved = redistribute(given, mesh, placements_of(target));
  } else {
    // A whole tensor is Replicate everywhere: the target's shards are cut from it here, no collective.
    const at::Tensor whole = given.to(local_tensor_of(target).device());
    moved = redistribute(from_local(whole, mesh, Placements(mesh->ndim(), Replicate()), {.run_check = false}),
                         placements_of(target));
  }
  to_local(target).copy_(to_local(moved));
}

// The world of the first DTensor among `targets` (what broadcast_from_rank0 broadcasts over).
std::shared_ptr<World> world_of(const State& targets) {
  for (const auto& [name, tensor] : targets)
    if (is_dtensor(tensor)) return mesh_of(tensor)->world();
  throw DTensorError("set_state_dict: broadcast_from_rank0 needs a module holding DTensors (their world is what it "
                     "broadcasts over); for plain tensors pass the dict on every rank");
}

// What does not fit between the dict and the entries: a key problem under `strict`, a shape.
std::string problems_of(const State& targets, const StateDict& given, const std::string& prefix, const StateDictOptions& options,
                        IncompatibleKeys& keys) {
  for (const auto& [name, tensor] : targets)
    if (has_prefix(name, prefix) && !given.count(name.substr(prefix.size()))) keys.missing.push_back(name.substr(prefix.size()));
  for (const auto& [name, tensor] : given) {
    const auto target = targets.find(prefix + name);
    if (target == targets.end()) keys.unexpected.push_back(name);
    else if (tensor.sizes() != target->second.sizes())  // a DTensor's sizes are its global ones
      return "'" + name + "' has the shape " + shape_text(tensor.sizes()) + ", but the module's is " + shape_text(target->second.sizes());
  }
  if (!options.strict || (keys.missing.empty() && keys.unexpected.empty())) return "";
  const std::string first = keys.missing.empty() ? keys.unexpected[0] : keys.missing[0];
  return std::to_string(keys.missing.size()) + " entries missing and " + std::to_string(keys.unexpected.size()) +
         " unexpected (the first: '" + first + "'); give every entry and no other, or set StateDictOptions::strict = false";
}

// Fills the entries under `prefix` from `given`; returns the names (with prefix) left unfilled. With
// broadcast_from_rank0 rank 0 checks its dict and tells the others its keys and any problem, and each
// tensor it gives is broadcast, in name order.
std::vector<std::string> fill(const State& targets, const StateDict& given, const std::string& prefix, const StateDictOptions& options,
                              IncompatibleKeys& keys, MeshPtr& everyone) {
  const std::shared_ptr<World> world = options.full_state_dict && options.broadcast_from_rank0 ? world_of(targets) : nullptr;
  const bool reads = !world || world->rank() == 0;
  std::string problem = reads ? problems_of(targets, given, prefix, options, keys) : "";
  std::set<std::string> keys_given;
  for (const auto& [name, tensor] : given) keys_given.insert(name);
  if (world) {
    std::string message = problem;
    for (const auto& name : keys_given) message += "\n" + name;
    std::istringstream from_rank0(world->gather_across_ranks(reads ? message : "")[0]);
    std::getline(from_rank0, problem);
    keys_given.clear();
    for (std::string name; std::getline(from_rank0, name);) keys_given.insert(name);
    if (!reads) keys = {};  // only rank 0 knows what its dict lacks
  }
  if (!problem.empty()) throw DTensorError("set_state_dict: " + problem);
  if (world && !everyone) everyone = DeviceMesh::create(world, {world->size()});  // one per set call: groups cost
  std::vector<std::string> unfilled;
  for (const auto& [name, target] : targets) {
    if (!has_prefix(name, prefix)) continue;
    const std::string key = name.substr(prefix.size());
    if (!keys_given.count(key)) {
      unfilled.push_back(name);
    } else if (!world) {
      copy_into(target, given.at(key));
    } else {
      const at::Tensor buffer = reads ? given.at(key).to(at::kCPU, target.scalar_type()).contiguous()
                                      : at::empty(target.sizes(), target.options().device(at::kCPU));
      copy_into(target, to_local(distribute_tensor(buffer, everyone, Placements{Replicate()})));
    }
  }
  return unfilled;
}

IncompatibleKeys set_entries(TrainingState& state, const std::vector<std::pair<std::string, const StateDict*>>& dicts,
                             const StateDictOptions& options) {
  std::vector<std::string> names;
  for (const auto& [prefix, dict] : dicts)
    for (const auto& [name, tensor] : *dict) names.push_back(prefix + name);
  IncompatibleKeys keys;
  MeshPtr everyone;  // broadcast_from_rank0's world mesh, made on first use
  state.load_with(names, [&](const State& targets) {
    std::vector<std::string> unfilled;
    for (const auto& [prefix, dict] : dicts) {
      auto left = fill(targets, *dict, prefix, options, keys, everyone);
      unfilled.insert(unfilled.end(), left.begin(), left.end());
    }
    return unfilled;
  });
  return keys;
}

}  // namespace

StateDict get_model_state_dict(torch::nn::Module& module, const StateDictOptions& options) {
  return entries_under(TrainingState(module).entries(), kModel, options);
}

StateDict get_optimizer_state_dict(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const StateDictOptions& options) {
  return entries_under(TrainingState(module, &optimizer).entries(), kOptimizer, options);
}

std::pair<StateDict, StateDict> get_state_dict(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                               const StateDictOptions& options) {
  const State entries = TrainingState(module, &optimizer).entries();
  return {entries_under(entries, kModel, options), entries_under(entries, kOptimizer, options)};
}

IncompatibleKeys set_model_state_dict(torch::nn::Module& module, const StateDict& state, const StateDictOptions& options) {
  TrainingState training(module);
  return set_entries(training, {{kModel, &state}}, options);
}

IncompatibleKeys set_optimizer_state_dict(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const StateDict& state,
                                          const StateDictOptions& options) {
  TrainingState training(module, &optimizer);
  return set_entries(training, {{kOptimizer, &state}}, options);
}

IncompatibleKeys set_state_dict(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const StateDict& model_state,
                                const StateDict& optimizer_state, const StateDictOptions& options) {
  TrainingState training(module, &optimizer);
  return set_entries(training, {{kModel, &model_state}, {kOptimizer, &optimizer_state}}, options);
}

}  // namespace dtensor::checkpoint
