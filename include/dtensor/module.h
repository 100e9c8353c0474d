#pragma once
// torch::nn modules that hold DTensors.
//
// C++ modules have no forward hooks (forward is not even virtual), so dtensor keeps its own: hooks
// registered on a module run when the module is called through dtensor::call(module, args...). For a
// module without hooks that call is exactly module->forward(args...), so one model source serves the
// single-device run and the parallel one. Parameter placements need no hooks at all: they live in the
// parameters themselves, which distribute_parameter swaps for DTensors.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/placement.h"

namespace torch::nn {
class LinearImpl;
}

namespace dtensor {

// Runs before forward on the module's Tensor arguments (in argument order); may replace them.
using ForwardPreHook = std::function<void(torch::nn::Module& module, std::vector<at::Tensor>& inputs)>;
// Runs after forward on its Tensor result and returns what the caller gets.
using ForwardHook = std::function<at::Tensor(torch::nn::Module& module, at::Tensor output)>;

// The module's forward as a function of its Tensor arguments (its other arguments kept by value), which
// may be called again after dtensor::call returned, e.g. to recompute it in backward.
using ForwardFunction = std::function<at::Tensor(std::vector<at::Tensor> inputs)>;
// Runs the forward in its place: gets the Tensor arguments (after the pre-hooks) and the forward, and
// returns the result (before the output hooks). One per module; for modules whose forward returns a
// single Tensor and takes copyable arguments.
using ForwardWrapper =
    std::function<at::Tensor(torch::nn::Module& module, const std::vector<at::Tensor>& inputs, const ForwardFunction& forward)>;
void register_forward_pre_hook(torch::nn::Module& module, ForwardPreHook hook);
void register_forward_hook(torch::nn::Module& module, ForwardHook hook);
void register_forward_wrapper(torch::nn::Module& module, ForwardWrapper wrapper);
void remove_forward_hooks(torch::nn::Module& module);

// Replaces the direct parameter (or buffer) `name` of `module` with `value` everywhere the module keeps
// it: its registry and, for the module types dtensor knows (Linear, Embedding, LayerNorm, GroupNorm,
// Conv1d/2d/3d, BatchNorm1d/2d/3d, and those added with register_tensor_members), the public member
// variable. Throws DTensorError if anything else still holds the old tensor afterwards (an optimizer
// built before parallelizing, a member of a module type dtensor was not told about, a tied weight),
// because such a handle would keep training the unsharded tensor. `path` names it in errors.
void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value, const std::string& path);
void replace_buffer(torch::nn::Module& module, const std::string& name, at::Tensor value, const std::string& path);

// Makes parameter `name` of `module` a DTensor with `placements` on `mesh` (a leaf that keeps
// requires_grad), registered as above. Its gradient is brought to the parameter's placements as it
// arrives (a Partial gradient over a data-parallel dim is all-reduced there), so optimizers see
// gradients laid out like their parameters.
void distribute_parameter(torch::nn::Module& module, const std::string& name, const MeshPtr& mesh,
                          const Placements& placements, const std::string& path);

// Installs `param`, a DTensor leaf, as parameter `name` of `module` (replace_parameter), with the
// gradient hook described above.
void set_dtensor_parameter(torch::nn::Module& module, const std::string& name, at::Tensor param,
                           const std::string& path);
// The parameter `name` of `module`; throws DTensorError listing its parameters when there is none.
const at::Tensor& parameter_of(torch::nn::Module& module, const std::string& name, const std::string& path);

// Tells replace_parameter which member variables of a user module type hold its tensors, e.g.
//   register_tensor_members<AttentionImpl>({{"wq", &AttentionImpl::wq}, {"bias", &AttentionImpl::bias}});
template <typename Impl>
void register_tensor_members(const std::vector<std::pair<std::string, at::Tensor Impl::*>>& members);

// distribute_module (PyTorch's, for C++): partition_fn(name, submodule, mesh) runs for the module and
// every submodule (name "" is the module itself) and may distribute their parameters; every parameter
// and buffer still a plain tensor afterwards becomes a Replicate DTensor. input_fn and output_fn
// become the module's forward hooks (they run when it is called through dtensor::call or through the
// DistributedModule wrapper the template overload returns).
using PartitionFn = std::function<void(const std::string& name, torch::nn::Module& module, const MeshPtr& mesh)>;
using InputFn = std::function<void(torch::nn::Module& module, std::vector<at::Tensor>& inputs, const MeshPtr& mesh)>;
using OutputFn = std::function<at::Tensor(torch::nn::Module& module, at::Tensor output, const MeshPtr& mesh)>;
void distribute_module(torch::nn::Module& module, const MeshPtr& mesh, const PartitionFn& partition_fn = {},
                       const InputFn& input_fn = {}, const OutputFn& output_fn = {});

// Calls module->forward(args...) with the module's forward hooks around it. `module` is a
// ModuleHolder (torch::nn::Linear), a shared_ptr to a module, or a module reference. A
// torch::nn::Linear with DTensor parameters computes its forward as one aten::linear (see
// detail::forward_of), the same product as its own forward.
template <typename M, typename... Args>
decltype(auto) call(M&& module, Args&&... args);

// A module together with its hooks, keeping the module's forward signature: forward(args...) and
// operator() run dtensor::call; -> reaches the module itself.
template <typename Holder>
class DistributedModule {
 public:
  explicit DistributedModule(Holder module) : module_(std::move(module)) {}
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    return call(module_, std::forward<Args>(args)...);
  }
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return call(module_, std::forward<Args>(args)...);
  }
  auto* operator->() { return module_.get(); }
  Holder& module() { return module_; }

 private:
  Holder module_;
};

template <typename Impl>
DistributedModule<torch::nn::ModuleHolder<Impl>> distribute_module(torch::nn::ModuleHolder<Impl> module,
                                                                   const MeshPtr& mesh,
                                                                   const PartitionFn& partition_fn = {},
                                                                   const InputFn& input_fn = {},
                                                                   const OutputFn& output_fn = {}) {
  distribute_module(*module, mesh, partition_fn, input_fn, output_fn);
  return DistributedModule<torch::nn::ModuleHolder<Impl>>(std::move(module));
}

// ---- implementation ----

namespace detail {

struct ForwardHooks {
  std::vector<ForwardPreHook> pre;
  std::vector<ForwardHook> post;
  ForwardWrapper wrapper;  // empty: forward runs as it is
};
// Null when the module has none (the common, fast case).
std::shared_ptr<const ForwardHooks> forward_hooks_of(const torch::nn::Module& module);
void run_pre_hooks(const ForwardHooks& hooks, torch::nn::Module& module, std::vector<at::Tensor>& inputs);
at::Tensor run_post_hooks(const ForwardHooks& hooks, torch::nn::Module& module, at::Tensor output);
// Output hooks and wrappers need a Tensor result; throws for a module whose forward returns something else.
void require_no_post_hooks(const ForwardHooks& hooks, const torch::nn::Module& module);
// A wrapper needs arguments it can keep; throws for a module whose forward takes others.
[[noreturn]] void refuse_wrapper_for_arguments(const torch::nn::Module& module);

using TensorMember = std::function<at::Tensor&(torch::nn::Module&)>;
void add_tensor_member(std::type_index type, const std::string& name, TensorMember member);

template <typename T>
constexpr bool is_tensor_v = std::is_same_v<std::decay_t<T>, at::Tensor>;

template <typename... Args>
constexpr std::size_t tensors_before(std::size_t position) {
  constexpr bool is_tensor[] = {is_tensor_v<Args>..., false};
  std::size_t n = 0;
  for (std::size_t i = 0; i < position; ++i) n += is_tensor[i] ? 1 : 0;
  return n;
}

// Argument P as forward receives it: a Tensor argument as the hooks left it, anything else untouched.
template <std::size_t P, typename... Args, typename Arg>
decltype(auto) hooked_argument(std::vector<at::Tensor>& inputs, Arg&& arg) {
  if constexpr (is_tensor_v<Arg>)
    return static_cast<const at::Tensor&>(inputs[tensors_before<Args...>(P)]);
  else
    return std::forward<Arg>(arg);
}

// torch::nn::Linear's forward (torch::nn::functional::linear) is a transpose, a matmul and a bias add.
// With DTensor parameters the Linear runs as the one aten::linear they compute, which dtensor runs on
// the shards as one op with one autograd node (src/sharding/kernels/fused_linear.cpp); with plain
// parameters, as its own forward.
at::Tensor forward_linear(torch::nn::LinearImpl& linear, const at::Tensor& input);

template <typename Impl, typename... Args>
decltype(auto) forward_of(Impl& impl, Args&&... args) {
  if constexpr (std::is_same_v<Impl, torch::nn::LinearImpl> && sizeof...(Args) == 1)
    return forward_linear(impl, std::forward<Args>(args)...);
  else
    return impl.forward(std::forward<Args>(args)...);
}

template <typename... Args, typename Impl, typename Tuple, std::size_t... P>
decltype(auto) forward_hooked(Impl& impl, std::vector<at::Tensor>& inputs, Tuple args, std::index_sequence<P...>) {
  return forward_of(impl, hooked_argument<P, Args...>(inputs, std::get<P>(std::move(args)))...);
}

// Forward through the module's wrapper: the forward handed to it keeps copies of the non-Tensor
// arguments, so that it can run again later.
template <typename... Args, typename Impl>
at::Tensor forward_wrapped(const ForwardHooks& hooks, Impl& impl, const std::vector<at::Tensor>& inputs, Args&&... args) {
  if constexpr ((std::is_copy_constructible_v<std::decay_t<Args>> && ...)) {
    auto kept = std::make_shared<std::tuple<std::decay_t<Args>...>>(std::forward<Args>(args)...);
    const ForwardFunction forward = [&impl, kept](std::vector<at::Tensor> tensors) -> at::Tensor {
      return std::apply(
          [&](auto&... arg) {
            return forward_hooked<std::decay_t<Args>&...>(impl, tensors, std::forward_as_tuple(arg...), std::index_sequence_for<Args...>{});
          },
          *kept);
    };
    return hooks.wrapper(impl, inputs, forward);
  } else {
    refuse_wrapper_for_arguments(impl);
  }
}

template <typename Impl>
Impl& module_of(torch::nn::ModuleHolder<Impl>& holder) {
  return *holder;
}
template <typename Impl>
Impl& module_of(const std::shared_ptr<Impl>& module) {
  return *module;
}
template <typename Impl>
  requires std::derived_from<Impl, torch::nn::Module>
Impl& module_of(Impl& module) {
  return module;
}

}  // namespace detail

template <typename M, typename... Args>
decltype(auto) call(M&& module, Args&&... args) {
  auto& impl = detail::module_of(module);
  using Result = decltype(impl.forward(std::forward<Args>(args)...));
  const auto hooks = detail::forward_hooks_of(impl);
  if (!hooks) return static_cast<Result>(detail::forward_of(impl, std::forward<Args>(args)...));
  std::vector<at::Tensor> inputs;
  (
      [&](const auto& arg) {
        if constexpr (detail::is_tensor_v<decltype(arg)>) inputs.push_back(arg);
      }(args),
      ...);
  detail::run_pre_hooks(*hooks, impl, inputs);
  if constexpr (std::is_same_v<std::decay_t<Result>, at::Tensor>) {
    at::Tensor out = hooks->wrapper ? detail::forward_wrapped(*hooks, impl, inputs, std::forward<Args>(args)...)
                                    : detail::forward_hooked<Args...>(impl, inputs, std::forward_as_tuple(std::forward<Args>(args)...),
                                                                      std::index_sequence_for<Args...>{});
    return static_cast<Result>(detail::run_post_hooks(*hooks, impl, std::move(out)));
  } else {
    detail::require_no_post_hooks(*hooks, impl);  // wrappers too
    return static_cast<Result>(detail::forward_hooked<Args...>(
        impl, inputs, std::forward_as_tuple(std::forward<Args>(args)...), std::index_sequence_for<Args...>{}));
  }
}

template <typename Impl>
void register_tensor_members(const std::vector<std::pair<std::string, at::Tensor Impl::*>>& members) {
  // An init-capture, not the structured binding itself: clang before 16 cannot capture those.
  for (const auto& [name, member] : members)
    detail::add_tensor_member(typeid(Impl), name,
                              [member = member](torch::nn::Module& m) -> at::Tensor& { return static_cast<Impl&>(m).*member; });
}

}  // namespace dtensor
