// fully_shard: which parameters a module's group takes, the checks on them, the forward hooks that
// gather and free the group around the module's forward (and call_as_forward's), and FSDP2's controls.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <unordered_map>
#include <variant>

#include "dtensor/api.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "dtensor/fsdp.h"
#include "dtensor/module.h"
#include "fsdp_group.h"
#include "parameter_slots.h"

namespace dtensor {
namespace {

using detail::FsdpGroup;
using detail::ParameterSlot;

// Groups by module address; the weak owner tells a destroyed module from a new one at the same address.
struct Entry {
  std::weak_ptr<torch::nn::Module> owner;
  bool has_owner = false;
  std::shared_ptr<FsdpGroup> group;
};

std::mutex groups_mutex;
std::unordered_map<const torch::nn::Module*, Entry>& groups() {
  static std::unordered_map<const torch::nn::Module*, Entry> entries;
  return entries;
}

std::shared_ptr<FsdpGroup> group_of(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(groups_mutex);
  auto it = groups().find(&module);
  if (it == groups().end()) return nullptr;
  if (it->second.has_owner && it->second.owner.expired()) {
    groups().erase(it);
    return nullptr;
  }
  return it->second.group;
}

std::shared_ptr<FsdpGroup> require_group(const torch::nn::Module& module, const char* operation) {
  auto group = group_of(module);
  if (!group)
    throw DTensorError(std::string(operation) + ": module " + module.name() +
                       " is not fully sharded (call fully_shard on it first)");
  return group;
}

void check_floating(const std::optional<at::ScalarType>& dtype, const char* field) {
  if (dtype && !at::isFloatingType(*dtype))
    throw DTensorError(std::string("fully_shard: MixedPrecisionPolicy::") + field + " is " + c10::toString(*dtype) +
                       ", which is not a floating-point dtype (use at::kBFloat16, at::kHalf or at::kFloat)");
}

// The parameters `module`'s group takes: its own and its submodules', except in submodules that are
// fully sharded already (their groups own them). A tensor registered in several places (a tied weight)
// is one parameter with several slots.
void collect(torch::nn::Module& module, const std::string& prefix, bool top,
             std::vector<FsdpGroup::Param>& params, std::map<const c10::TensorImpl*, size_t>& index) {
  if (!top && group_of(module)) return;
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    const std::string path = prefix + item.key();
    const at::Tensor& tensor = item.value();
    if (!tensor.defined()) continue;
    if (tensor.dim() == 0)
      throw DTensorError("fully_shard: parameter " + path + " has no dims; fully_shard shards dim 0 (make it shape [1])");
    auto [it, added] = index.emplace(tensor.unsafeGetTensorImpl(), params.size());
    if (added) params.emplace_back();
    params[it->second].slots.push_back(ParameterSlot{&module, item.key(), path});
  }
  for (const auto& child : module.named_children())
    collect(*child.value(), prefix + child.key() + ".", false, params, index);
}

// Where the group shards: its mesh, the dp dim, the replicas' dim (HSDP) and the TP dim's mesh.
struct Sharding {
  MeshPtr mesh;
  int64_t dp_dim = 0;
  int64_t replicate_dim = -1;  // -1: no replicas
  int64_t tp_dim = -1;         // -1: no tensor parallelism
  MeshPtr tp_mesh;             // null without tensor parallelism
  at::ScalarType compute_dtype(const at::Tensor& param) const;
  std::optional<at::ScalarType> param_dtype;
  decltype(FullyShardOptions::shard_dim) shard_dim;
  bool offload = false;  // CPU offload on a device mesh: the shards go to host memory
  bool pin_memory = false;
  // A shard as the group keeps it: with offload, a host copy (page-locked when asked).
  at::Tensor placed(const at::Tensor& local) const;
  // The dim of `tensor` (the parameter at `path`, or a TP parameter's local shard, which `tp` places)
  // sharded over dp: shard_dim's choice, else `fallback`.
  int64_t dim_of(const std::string& path, const at::Tensor& tensor, int64_t fallback, const Placement& tp = Replicate()) const;
};

at::ScalarType Sharding::compute_dtype(const at::Tensor& param) const { return param_dtype.value_or(param.scalar_type()); }

at::Tensor Sharding::placed(const at::Tensor& local) const {
  if (!offload) return local;
  const at::Tensor host = local.to(at::kCPU);
  return pin_memory ? host.pin_memory() : host;
}

int64_t Sharding::dim_of(const std::string& path, const at::Tensor& tensor, int64_t fallback, const Placement& tp) const {
  const std::optional<int64_t> chosen = shard_dim ? shard_dim(path, tensor) : std::nullopt;
  if (!chosen) return fallback;
  const int64_t dim = *chosen < 0 ? *chosen + tensor.dim() : *chosen;
  if (dim < 0 || dim >= tensor.dim())
    throw DTensorError("fully_shard: FullyShardOptions::shard_dim chose dim " + std::to_string(*chosen) + " for parameter " +
                       path + " of shape " + c10::str(tensor.sizes()) + ", which has no such dim");
  if (tp.is_sharding() && tp.dim() == dim)
    throw DTensorError("fully_shard: FullyShardOptions::shard_dim chose dim " + std::to_string(dim) + " for parameter " +
                       path + ", which tensor parallelism shards already (" + tp.str() +
                       "); choose another dim, or nullopt for the first dim TP leaves whole");
  return dim;
}

// `param` sharded over dp as the group keeps it: a plain parameter Shard(0) over dp (Replicate over
// TP); a TP parameter's local shard cut over dp along the first dim TP leaves whole.
void shard_one(FsdpGroup::Param& p, const at::Tensor& param, const Sharding& sharding) {
  const std::string& path = p.slots.front().path;
  const MeshPtr& mesh = sharding.mesh;
  if (!is_dtensor(param)) {
    p.dim = sharding.dim_of(path, param, 0);
    Placements placements(mesh->ndim(), Replicate());
    placements[sharding.dp_dim] = Shard(p.dim);
    p.sharded = distribute_tensor(param, mesh, placements);
    p.shape = param.sizes().vec();
    if (sharding.offload) {
      const bool requires_grad = p.sharded.requires_grad();
      p.sharded = make_dtensor(sharding.placed(local_tensor_of(p.sharded).detach()), dtensor_impl(p.sharded).shared_spec());
      p.sharded.set_requires_grad(requires_grad);
    }
    return;
  }
  if (!sharding.tp_mesh || !same_mesh(mesh_of(param), sharding.tp_mesh))
    throw DTensorError("fully_shard: parameter " + path + " is a DTensor on " + mesh_of(param)->str() + " (" +
                       describe(param) + "); fully_shard composes with tensor parallelism on a mesh dim of its own: " +
                       "parallelize on mesh[\"tp\"], then fully_shard on the whole mesh " +
                       (sharding.tp_mesh ? "(here " + sharding.tp_mesh->str() + ")" : std::string("(this mesh has no TP dim)")));
  const Placement tp = placements_of(param).front();
  if (tp.is_partial())
    throw DTensorError("fully_shard: parameter " + path + " is Partial over tensor parallelism (" + describe(param) +
                       "); redistribute it to Replicate or Shard first");
  const at::Tensor& tp_local = local_tensor_of(param);
  p.shape = tp_local.sizes().vec();
  int64_t whole_dim = -1;  // the first dim TP leaves whole, if any
  for (int64_t d = 0; d < tp_local.dim() && whole_dim < 0; ++d)
    if (!(tp.is_sharding() && tp.dim() == d)) whole_dim = d;
  p.dim = sharding.dim_of(path, tp_local, whole_dim, tp);
  Placements placements(mesh->ndim(), Replicate());
  placements[sharding.tp_dim] = tp;
  at::Tensor local = tp_local.detach();
  if (p.dim >= 0) {
    const int64_t n = mesh->size(sharding.dp_dim), r = (*mesh->coordinate())[sharding.dp_dim];
    const int64_t per_rank = (p.shape[p.dim] + n - 1) / n, start = std::min(r * per_rank, p.shape[p.dim]);
    local = tp_local.narrow(p.dim, start, std::min(per_rank, p.shape[p.dim] - start)).clone();
    placements[sharding.dp_dim] = Shard(p.dim);
  } else {
    placements[sharding.dp_dim] = Replicate();
  }
  const DTensorSpec& tp_spec = spec_of(param);
  p.sharded = make_dtensor(sharding.placed(local), DTensorSpec{mesh, placements, tp_spec.meta});
  if (param.requires_grad()) p.sharded.set_requires_grad(true);
  auto gathered = std::make_shared<DTensorSpec>(tp_spec);
  gathered->meta.dtype = sharding.compute_dtype(param);
  p.gathered_spec = std::move(gathered);
}

// Shards every parameter and installs it in all its slots; when some parameter is still held elsewhere
// (an optimizer made before, a weight tied to a module outside the group), every slot gets its old
// tensor back and nothing changes.
void shard_parameters(std::vector<FsdpGroup::Param>& params, const Sharding& sharding, const std::string& group) {
  std::vector<at::Tensor> old;
  for (FsdpGroup::Param& p : params) {
    const ParameterSlot& first = p.slots.front();
    old.push_back(parameter_of(*first.module, first.name, first.path));
  }
  auto restore = [&](size_t count) {
    for (size_t i = 0; i < count; ++i)
      for (const ParameterSlot& slot : params[i].slots) detail::set_parameter_slots(*slot.module, slot.name, old[i]);
  };
  for (size_t i = 0; i < params.size(); ++i) {
    try {
      shard_one(params[i], old[i], sharding);
    } catch (...) {
      restore(i);
      throw;
    }
    for (const ParameterSlot& slot : params[i].slots)
      detail::set_parameter_slots(*slot.module, slot.name, params[i].sharded);
    if (old[i].use_count() > 1) {
      const std::string path = params[i].slots.front().path;
      restore(i + 1);
      throw DTensorError("fully_shard(" + group + "): parameter " + path +
                         " is still referenced outside the module (" + std::to_string(old[i].use_count() - 1) +
                         " other handle(s)): an optimizer made before fully_shard (make it afterwards), a weight "
                         "tied to a module outside this group (parameters shared across groups are not supported: "
                         "shard the modules that share it as one group), or a member variable dtensor does not know "
                         "(tell it with register_tensor_members)");
    }
  }
}

// The mesh dims: which one FSDP shards over, which one (if named so) holds replicas, and the remaining
// one's mesh, tensor parallelism's.
Sharding sharding_of(const MeshPtr& mesh, const FullyShardOptions& options, const std::string& name) {
  Sharding sharding{mesh};
  sharding.param_dtype = options.mp_policy.param_dtype;
  sharding.shard_dim = options.shard_dim;
  sharding.offload = detail::offloads_to_host(options, *mesh);
  if (const auto* cpu = std::get_if<CPUOffloadPolicy>(&options.offload_policy)) sharding.pin_memory = cpu->pin_memory;
  if (mesh->ndim() == 1) return sharding;
  const auto& names = mesh->dim_names();
  const auto index_of = [&names](const std::string& dim) -> int64_t {
    const auto it = std::find(names.begin(), names.end(), dim);
    return it == names.end() ? -1 : it - names.begin();
  };
  sharding.dp_dim = index_of(options.dp_dim);
  sharding.replicate_dim = options.replicate_dim.empty() ? -1 : index_of(options.replicate_dim);
  const int64_t others = mesh->ndim() - 1 - (sharding.replicate_dim >= 0 ? 1 : 0);
  if (sharding.dp_dim < 0 || sharding.replicate_dim == sharding.dp_dim || mesh->ndim() > 3 || others > 1)
    throw DTensorError("fully_shard(" + name + "): the mesh " + mesh->str() + " has no dim named '" + options.dp_dim +
                       "' (FullyShardOptions::dp_dim) for data parallelism, or more dims than one each for data "
                       "parallelism, its replicas (a dim named '" + options.replicate_dim +
                       "', FullyShardOptions::replicate_dim) and tensor parallelism");
  for (int64_t d = 0; d < mesh->ndim(); ++d)
    if (d != sharding.dp_dim && d != sharding.replicate_dim) sharding.tp_dim = d;
  if (sharding.tp_dim >= 0) sharding.tp_mesh = mesh->slice({names[sharding.tp_dim]});
  return sharding;
}

void cast_floating(std::vector<at::Tensor>& tensors, at::ScalarType dtype) {
  for (at::Tensor& t : tensors)
    if (t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != dtype) t = t.to(dtype);
}

// The module's forward begins: its group gathered, the floating inputs cast to param_dtype.
void begin_forward(FsdpGroup& group, std::vector<at::Tensor>& inputs) {
  group.before_forward();
  if (const auto dtype = group.options().mp_policy.param_dtype) cast_floating(inputs, *dtype);
}

// The module's forward ends: the floating outputs cast to output_dtype, the parameters freed (or
// kept), and on each output a backward can start from, the hook that runs before the module's
// backward (the gradient of its outputs reaches it before anything inside it runs).
void end_forward(const std::shared_ptr<FsdpGroup>& group, std::vector<at::Tensor>& outputs) {
  if (const auto dtype = group->options().mp_policy.output_dtype) cast_floating(outputs, *dtype);
  const auto differentiable = [](const at::Tensor& t) { return t.defined() && t.requires_grad(); };
  const bool backward_follows =
      torch::autograd::GradMode::is_enabled() && std::any_of(outputs.begin(), outputs.end(), differentiable);
  if (!group->after_forward(backward_follows)) return;
  for (at::Tensor& output : outputs)
    if (differentiable(output)) output.register_hook([group](const at::Tensor&) { group->before_backward(); });
}

void install_hooks(torch::nn::Module& module, const std::shared_ptr<FsdpGroup>& group) {
  register_forward_pre_hook(module,
                            [group](torch::nn::Module&, std::vector<at::Tensor>& inputs) { begin_forward(*group, inputs); });
  register_forward_hook(module, [group](torch::nn::Module&, at::Tensor output) {
    std::vector<at::Tensor> outputs{std::move(output)};
    end_forward(group, outputs);
    return std::move(outputs.front());
  });
}

// A module's name in errors: its type, and its path under its root when it has one.
std::string describe_module(const torch::nn::Module& module) {
  const auto group = group_of(module);
  const std::string& label = group ? group->label() : std::string();
  return module.name() + (group && label != "fully_shard(" + module.name() + ")" ? " (" + label + ")" : "");
}

// The groups of `module`'s prefetch list `modules`, checked: fully sharded, under the same root as `group`.
std::vector<std::weak_ptr<FsdpGroup>> prefetch_groups(const torch::nn::Module& module, const FsdpGroup& group,
                                                      const char* operation,
                                                      const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  const std::string where = std::string(operation) + "(" + describe_module(module) + "): ";
  std::vector<std::weak_ptr<FsdpGroup>> groups;
  for (size_t i = 0; i < modules.size(); ++i) {
    if (!modules[i]) throw DTensorError(where + "entry " + std::to_string(i) + " of the list is null");
    const auto target = group_of(*modules[i]);
    if (!target)
      throw DTensorError(where + "entry " + std::to_string(i) + ", module " + modules[i]->name() +
                         ", is not fully sharded: list only modules fully_shard was called on");
    const auto root_of = [](const FsdpGroup& g) { return g.root() ? g.root()->label() : std::string("gone"); };
    if (target->root() != group.root())
      throw DTensorError(where + "entry " + std::to_string(i) + ", module " + describe_module(*modules[i]) +
                         ", is not under the same fully-sharded root (its root is " + root_of(*target) + ", this module's " +
                         root_of(group) + "): list modules of the same model, and fully_shard its root before setting the lists");
    groups.push_back(target);
  }
  return groups;
}

}  // namespace

void fully_shard(torch::nn::Module& module, const MeshPtr& mesh, const FullyShardOptions& options) {
  const std::string name = module.name();
  if (!mesh) throw DTensorError("fully_shard(" + name + "): the mesh is null");
  if (!mesh->contains_this_rank())
    throw DTensorError("fully_shard(" + name + "): the mesh " + mesh->str() +
                       " does not hold this rank; every rank of the mesh calls fully_shard with a mesh it is in");
  if (group_of(module))
    throw DTensorError("fully_shard(" + name + "): the module is fully sharded already (fully_shard runs once per module)");
  check_floating(options.mp_policy.param_dtype, "param_dtype");
  check_floating(options.mp_policy.reduce_dtype, "reduce_dtype");
  check_floating(options.mp_policy.output_dtype, "output_dtype");
  const Sharding sharding = sharding_of(mesh, options, name);

  std::vector<FsdpGroup::Param> params;
  std::map<const c10::TensorImpl*, size_t> index;
  collect(module, "", true, params, index);
  shard_parameters(params, sharding, name);
  auto group = std::make_shared<FsdpGroup>(name, mesh, sharding.dp_dim, sharding.replicate_dim, options, std::move(params));
  // This module's group is the root of every group in it, however deep; their paths are under it.
  for (const auto& item : module.named_modules())
    if (auto inside = group_of(*item.value())) {
      inside->set_root(group);
      inside->set_path(item.key());
    }
  group->set_root(group);
  install_hooks(module, group);
  std::lock_guard<std::mutex> lock(groups_mutex);
  Entry& entry = groups()[&module];
  entry.owner = module.weak_from_this();
  entry.has_owner = !entry.owner.expired();
  entry.group = std::move(group);
}

bool is_fully_sharded(const torch::nn::Module& module) { return group_of(module) != nullptr; }

void unshard(torch::nn::Module& module) { require_group(module, "unshard")->unshard(); }

void reshard(torch::nn::Module& module) { require_group(module, "reshard")->reshard(); }

void set_requires_gradient_sync(torch::nn::Module& module, bool requires_sync, bool recurse) {
  if (!recurse) return require_group(module, "set_requires_gradient_sync")->set_requires_gradient_sync(requires_sync);
  for (const auto& item : module.named_modules())
    if (auto group = group_of(*item.value())) group->set_requires_gradient_sync(requires_sync);
}

UnshardHandle unshard(torch::nn::Module& module, bool async_op) {
  const auto group = require_group(module, "unshard");
  if (!async_op) {
    group->unshard();
    return UnshardHandle();
  }
  group->start_unshard();
  return UnshardHandle(group);
}

void UnshardHandle::wait() {
  if (!group_) return;
  group_->wait_for_unshard();
  group_.reset();
}

namespace {

// The groups a setter applies to: `module`'s (which must be fully sharded) and, with recurse, those of
// every fully-sharded module inside it.
std::vector<std::shared_ptr<FsdpGroup>> groups_in(torch::nn::Module& module, const char* operation, bool recurse) {
  std::vector<std::shared_ptr<FsdpGroup>> out{require_group(module, operation)};
  if (recurse)
    for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false))
      if (auto group = group_of(*item.value())) out.push_back(std::move(group));
  return out;
}

}  // namespace

void set_reshard_after_backward(torch::nn::Module& module, bool reshard_after_backward, bool recurse) {
  for (const auto& group : groups_in(module, "set_reshard_after_backward", recurse)) group->set_reshard_after_backward(reshard_after_backward);
}

void set_reshard_after_forward(torch::nn::Module& module, bool reshard_after_forward, bool recurse) {
  for (const auto& group : groups_in(module, "set_reshard_after_forward", recurse))
    group->set_reshard_after_forward(reshard_after_forward);
}

void set_gradient_divide_factor(torch::nn::Module& module, double factor) {
  const auto group = require_group(module, "set_gradient_divide_factor");
  if (!(factor > 0) || !std::isfinite(factor))
    throw DTensorError("set_gradient_divide_factor(" + describe_module(module) + "): the factor is " + c10::str(factor) +
                       "; give a positive finite number (the gradients are summed over the data-parallel ranks, then "
                       "divided by it; the world size averages)");
  group->set_gradient_divide_factor(factor);
}

void set_requires_all_reduce(torch::nn::Module& module, bool requires_all_reduce, bool recurse) {
  for (const auto& group : groups_in(module, "set_requires_all_reduce", recurse)) group->set_requires_all_reduce(requires_all_reduce);
}

void set_unshard_in_backward(torch::nn::Module& module, bool unshard_in_backward) {
  require_group(module, "set_unshard_in_backward")->set_unshard_in_backward(unshard_in_backward);
}

void reset_iter_state(torch::nn::Module& module) {
  for (const auto& group : groups_in(module, "reset_iter_state", true)) group->reset_iter_state();
}

void set_all_reduce_hook(torch::nn::Module& module, std::function<void(const at::Tensor&)> hook) {
  require_group(module, "set_all_reduce_hook")->set_all_reduce_hook(std::move(hook));
}

void set_modules_to_forward_prefetch(torch::nn::Module& module, const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  const auto group = require_group(module, "set_modules_to_forward_prefetch");
  group->set_forward_prefetch(prefetch_groups(module, *group, "set_modules_to_forward_prefetch", modules));
}

void set_modules_to_backward_prefetch(torch::nn::Module& module, const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  const auto group = require_group(module, "set_modules_to_backward_prefetch");
  group->set_backward_prefetch(prefetch_groups(module, *group, "set_modules_to_backward_prefetch", modules));
}

bool offloads_to_cpu(const torch::nn::Module& module) { return require_group(module, "offloads_to_cpu")->offloaded(); }

namespace detail {

FsdpForwardScope::FsdpForwardScope(torch::nn::Module& module, std::vector<at::Tensor>& inputs) : group_(group_of(module)) {
  if (!group_) return;  // not fully sharded: fn runs as it is
  begin_forward(*group_, inputs);
  group_->hold();
}

FsdpForwardScope::~FsdpForwardScope() {
  if (!group_ || finished_) return;
  // fn threw: nothing it made can reach a backward, so the parameters are freed (unless an enclosing
  // call_as_forward still holds them).
  group_->release();
  if (!group_->held()) {
    try {
      group_->reshard();
    } catch (...) {  // already unwinding fn's exception: that one is what the caller sees
    }
  }
}

void FsdpForwardScope::finish(std::vector<at::Tensor>& outputs) {
  finished_ = true;
  if (!group_) return;
  group_->release();
  end_forward(group_, outputs);
}

}  // namespace detail

}  // namespace dtensor
