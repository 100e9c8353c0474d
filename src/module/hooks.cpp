// The forward-hook registry behind dtensor::call. Keyed by module address; each entry remembers the
// module's shared owner (when it has one) so that hooks of a destroyed module never attach to a new
// module allocated at the same address.

#include <mutex>
#include <unordered_map>

#include "dtensor/errors.h"
#include "dtensor/module.h"

namespace dtensor {
namespace {

struct Entry {
  std::weak_ptr<torch::nn::Module> owner;
  bool has_owner = false;
  std::shared_ptr<const detail::ForwardHooks> hooks;
};

std::mutex registry_mutex;
std::unordered_map<const torch::nn::Module*, Entry>& registry() {
  static std::unordered_map<const torch::nn::Module*, Entry> entries;
  return entries;
}

// A copy of the module's hooks with `change` applied (hooks are copied on write, so a forward already
// running keeps the set it started with).
template <typename Change>
void update_hooks(torch::nn::Module& module, Change change) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  Entry& entry = registry()[&module];
  if (entry.has_owner && entry.owner.expired()) entry = Entry{};
  auto hooks = entry.hooks ? std::make_shared<detail::ForwardHooks>(*entry.hooks) : std::make_shared<detail::ForwardHooks>();
  change(*hooks);
  entry.owner = module.weak_from_this();
  entry.has_owner = !entry.owner.expired();
  entry.hooks = std::move(hooks);
}

}  // namespace

void register_forward_pre_hook(torch::nn::Module& module, ForwardPreHook hook) {
  update_hooks(module, [&](detail::ForwardHooks& hooks) { hooks.pre.push_back(std::move(hook)); });
}

void register_forward_hook(torch::nn::Module& module, ForwardHook hook) {
  update_hooks(module, [&](detail::ForwardHooks& hooks) { hooks.post.push_back(std::move(hook)); });
}

void register_forward_wrapper(torch::nn::Module& module, ForwardWrapper wrapper) {
  update_hooks(module, [&](detail::ForwardHooks& hooks) {
    if (hooks.wrapper)
      throw DTensorError("module " + module.name() + " already has a forward wrapper (input_reshard); it takes one");
    hooks.wrapper = std::move(wrapper);
  });
}

void remove_forward_hooks(torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().erase(&module);
}

namespace detail {

std::shared_ptr<const ForwardHooks> forward_hooks_of(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(&module);
  if (it == registry().end()) return nullptr;
  if (it->second.has_owner && it->second.owner.expired()) {
    registry().erase(it);
    return nullptr;
  }
  return it->second.hooks;
}

void run_pre_hooks(const ForwardHooks& hooks, torch::nn::Module& module, std::vector<at::Tensor>& inputs) {
  for (const auto& hook : hooks.pre) hook(module, inputs);
}

at::Tensor run_post_hooks(const ForwardHooks& hooks, torch::nn::Module& module, at::Tensor output) {
  for (const auto& hook : hooks.post) output = hook(module, std::move(output));
  return output;
}

void require_no_post_hooks(const ForwardHooks& hooks, const torch::nn::Module& module) {
  if (hooks.wrapper)
    throw DTensorError("module " + module.name() +
                       " has a forward wrapper (input_reshard), but its forward does not return a single Tensor; wrap a module "
                       "that does");
  if (!hooks.post.empty())
    throw DTensorError("module " + module.name() +
                       " has output hooks (an output layout or output_fn), but its forward does not return a single "
                       "Tensor; convert its outputs in the caller instead");
}

void refuse_wrapper_for_arguments(const torch::nn::Module& module) {
  throw DTensorError("module " + module.name() +
                     " has a forward wrapper (input_reshard), which keeps the forward's arguments to run it again, but "
                     "one of its arguments cannot be copied; wrap a module whose forward takes copyable arguments");
}

}  // namespace detail
}  // namespace dtensor
