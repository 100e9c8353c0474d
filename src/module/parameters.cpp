// Swapping a module's tensors for DTensors. A C++ module keeps each parameter twice: in its registry
// (`parameters_`, which parameters() and optimizers read) and usually in a public member that forward
// uses (LinearImpl::weight). Both must change, and nothing else may keep the old tensor.

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <map>
#include <mutex>

#include "dtensor/api.h"
#include "dtensor/errors.h"
#include "dtensor/module.h"
#include "parameter_slots.h"

namespace dtensor {

using TensorRegistry = torch::OrderedDict<std::string, at::Tensor>;

namespace {

// `parameters_` is protected: a derived class may name it, and the pointer to member works on any Module.
struct ParameterRegistry : torch::nn::Module {
  static TensorRegistry& of(torch::nn::Module& module) { return module.*(&ParameterRegistry::parameters_); }
};

}  // namespace

// `buffers_` is private and LibTorch offers no way to replace a buffer (register_buffer refuses an
// existing name). An explicit instantiation may name a private member; the friend it defines hands out
// the registry. This is the only place dtensor reaches into LibTorch's privates.
TensorRegistry& buffer_registry(torch::nn::Module& module);
template <TensorRegistry torch::nn::Module::*Member>
struct BufferRegistryAccess {
  friend TensorRegistry& buffer_registry(torch::nn::Module& module) { return module.*Member; }
};
template struct BufferRegistryAccess<&torch::nn::Module::buffers_>;

namespace {

std::mutex members_mutex;
std::map<std::type_index, std::map<std::string, detail::TensorMember>>& members_by_type() {
  static std::map<std::type_index, std::map<std::string, detail::TensorMember>> members;
  return members;
}

const bool builtin_members_registered = [] {
  using namespace torch::nn;
  register_tensor_members<LinearImpl>({{"weight", &LinearImpl::weight}, {"bias", &LinearImpl::bias}});
  register_tensor_members<EmbeddingImpl>({{"weight", &EmbeddingImpl::weight}});
  register_tensor_members<EmbeddingBagImpl>({{"weight", &EmbeddingBagImpl::weight}});
  register_tensor_members<LayerNormImpl>({{"weight", &LayerNormImpl::weight}, {"bias", &LayerNormImpl::bias}});
  register_tensor_members<GroupNormImpl>({{"weight", &GroupNormImpl::weight}, {"bias", &GroupNormImpl::bias}});
  register_tensor_members<Conv1dImpl>({{"weight", &Conv1dImpl::weight}, {"bias", &Conv1dImpl::bias}});
  register_tensor_members<Conv2dImpl>({{"weight", &Conv2dImpl::weight}, {"bias", &Conv2dImpl::bias}});
  register_tensor_members<Conv3dImpl>({{"weight", &Conv3dImpl::weight}, {"bias", &Conv3dImpl::bias}});
  auto batch_norm = [](auto tag) {
    using Impl = typename decltype(tag)::type;
    register_tensor_members<Impl>({{"weight", &Impl::weight},
                                   {"bias", &Impl::bias},
                                   {"running_mean", &Impl::running_mean},
                                   {"running_var", &Impl::running_var},
                                   {"num_batches_tracked", &Impl::num_batches_tracked}});
  };
  batch_norm(std::type_identity<BatchNorm1dImpl>{});
  batch_norm(std::type_identity<BatchNorm2dImpl>{});
  batch_norm(std::type_identity<BatchNorm3dImpl>{});
  return true;
}();

// The public member variable that holds `name`, when dtensor knows the module's type.
void set_member(torch::nn::Module& module, const std::string& name, const at::Tensor& value) {
  std::lock_guard<std::mutex> lock(members_mutex);
  auto type = members_by_type().find(typeid(module));
  if (type == members_by_type().end()) return;
  auto member = type->second.find(name);
  if (member != type->second.end()) member->second(module) = value;
}

std::string names_of(const TensorRegistry& registry) {
  std::string out;
  for (const auto& item : registry) out += (out.empty() ? "" : ", ") + item.key();
  return out.empty() ? "none" : out;
}

void replace_tensor(TensorRegistry& registry, const char* kind, torch::nn::Module& module, const std::string& name,
                    at::Tensor value, const std::string& path) {
  at::Tensor* slot = registry.find(name);
  if (!slot)
    throw DTensorError(path + ": module " + module.name() + " has no " + kind + " '" + name + "' (its " + kind +
                       "s: " + names_of(registry) + ")");
  at::Tensor old = *slot;
  if (old.defined() && value.defined() && old.is_same(value)) return;
  *slot = value;
  set_member(module, name, value);
  // Our `old` is one reference; any other is a handle that would go on seeing the unsharded tensor.
  if (old.defined() && old.use_count() > 1)
    throw DTensorError(path + ": the old " + kind + " is still referenced outside the module's registry (" +
                       std::to_string(old.use_count() - 1) + " other handle(s)): a member variable of " + module.name() +
                       " that dtensor does not know (tell it with register_tensor_members<" + module.name() +
                       ">), an optimizer or a copy made before parallelizing (create optimizers afterwards), or a "
                       "weight tied to another module (tied weights must share one placement; distribute it once)");
}

// Names of the defined tensors of `registry` that are not DTensors yet.
std::vector<std::string> plain_tensor_names(const TensorRegistry& registry) {
  std::vector<std::string> names;
  for (const auto& item : registry)
    if (item.value().defined() && !is_dtensor(item.value())) names.push_back(item.key());
  return names;
}

}  // namespace

void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value, const std::string& path) {
  replace_tensor(ParameterRegistry::of(module), "parameter", module, name, std::move(value), path);
}

void replace_buffer(torch::nn::Module& module, const std::string& name, at::Tensor value, const std::string& path) {
  replace_tensor(buffer_registry(module), "buffer", module, name, std::move(value), path);
}

const at::Tensor& parameter_of(torch::nn::Module& module, const std::string& name, const std::string& path) {
  const at::Tensor* current = ParameterRegistry::of(module).find(name);
  if (!current || !current->defined())
    throw DTensorError(path + ": module " + module.name() + " has no parameter '" + name + "' (its parameters: " +
                       names_of(ParameterRegistry::of(module)) + ")");
  return *current;
}

void set_dtensor_parameter(torch::nn::Module& module, const std::string& name, at::Tensor param,
                           const std::string& path) {
  if (param.requires_grad()) {
    // Capture the spec, not the parameter: the hook lives on the parameter.
    std::shared_ptr<const DTensorSpec> spec = dtensor_impl(param, "set_dtensor_parameter").shared_spec();
    param.register_hook([spec](const at::Tensor& grad) -> at::Tensor {
      if (!grad.defined() || !is_dtensor(grad) || placements_of(grad) == spec->placements) return grad;
      return redistribute(grad, spec->mesh, spec->placements);
    });
  }
  replace_parameter(module, name, std::move(param), path);
}

void distribute_parameter(torch::nn::Module& module, const std::string& name, const MeshPtr& mesh,
                          const Placements& placements, const std::string& path) {
  const at::Tensor& current = parameter_of(module, name, path);
  at::Tensor param = distribute_tensor(current, mesh, placements);
  if (!current.is_same(param)) set_dtensor_parameter(module, name, std::move(param), path);
}

void distribute_module(torch::nn::Module& module, const MeshPtr& mesh, const PartitionFn& partition_fn,
                       const InputFn& input_fn, const OutputFn& output_fn) {
  if (!mesh) throw DTensorError("distribute_module: the mesh is null");
  const auto submodules = module.named_modules();
  if (partition_fn)
    for (const auto& item : submodules) partition_fn(item.key(), *item.value(), mesh);
  const Placements replicate(mesh->ndim(), Replicate());
  for (const auto& item : submodules) {
    torch::nn::Module& sub = *item.value();
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    // Names only: a held copy of the tensors would count as a stale handle in replace_parameter.
    for (const std::string& name : plain_tensor_names(sub.named_parameters(/*recurse=*/false)))
      distribute_parameter(sub, name, mesh, replicate, prefix + name);
    for (const std::string& name : plain_tensor_names(sub.named_buffers(/*recurse=*/false))) {
      at::Tensor buffer = distribute_tensor(*buffer_registry(sub).find(name), mesh, replicate);
      replace_buffer(sub, name, std::move(buffer), prefix + name);
    }
  }
  if (input_fn)
    register_forward_pre_hook(module, [input_fn, mesh](torch::nn::Module& m, std::vector<at::Tensor>& inputs) {
      input_fn(m, inputs, mesh);
    });
  if (output_fn)
    register_forward_hook(module, [output_fn, mesh](torch::nn::Module& m, at::Tensor output) {
      return output_fn(m, std::move(output), mesh);
    });
}

namespace detail {

void set_parameter_slots(torch::nn::Module& module, const std::string& name, const at::Tensor& value) {
  at::Tensor* slot = ParameterRegistry::of(module).find(name);
  if (!slot) throw DTensorError("module " + module.name() + " has no parameter '" + name + "'");
  *slot = value;
  set_member(module, name, value);
}

void add_tensor_member(std::type_index type, const std::string& name, TensorMember member) {
  std::lock_guard<std::mutex> lock(members_mutex);
  members_by_type()[type][name] = std::move(member);
}

}  // namespace detail
}  // namespace dtensor
