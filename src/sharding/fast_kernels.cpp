#include "fast_kernels.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "../tensor/as_dtensor.h"
#include "dispatch.h"
#include "dtensor/dtensor_impl.h"
#include "propagation.h"

namespace dtensor::detail {
namespace {

// The general kernel, for whatever the fast path does not take: the same call boxed.
at::Tensor general(const c10::OperatorHandle& op, c10::DispatchKeySet keys, c10::ArrayRef<c10::IValue> args) {
  torch::jit::Stack stack(args.begin(), args.end());
  dispatch_kernel(op, keys, &stack);
  return std::move(stack.back()).toTensor();
}

// One DTensor in, a view of it out, and a cached decision that asks for nothing but the op on the
// shard (no input moved, no argument or kernel of the rule's own): the op runs on the shard and the
// result is wrapped with the spec the general kernel would give it. Anything else (and any call on a
// rank outside the mesh) takes the general kernel.
template <typename LocalView>
at::Tensor one_tensor_view(const c10::OperatorHandle& op, c10::DispatchKeySet keys, const at::Tensor& self,
                           LocalView&& local_view) {
  const c10::IValue args[] = {self};
  const DTensorImpl* impl = as_dtensor(self);
  if (impl == nullptr || !impl->spec().mesh->contains_this_rank()) return general(op, keys, args);
  const std::vector<TensorInput> inputs = {TensorInput{0, -1, impl->shared_spec()}};
  const CachedDecision& cached = propagate(op, args, inputs, impl->spec().mesh);
  const OutputSharding& decision = cached.sharding;
  if (decision.input_moves[0] || decision.local_kernel || !decision.local_args.empty() || decision.outputs.size() != 1)
    return general(op, keys, args);
  record_op_for_debug(op, inputs);
  return wrap_local(local_view(impl->local()), output_spec(cached, 0, impl->spec().mesh, inputs));
}

c10::OperatorHandle handle(const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); }

at::Tensor fast_t(c10::DispatchKeySet keys, const at::Tensor& self) {
  static const c10::OperatorHandle op = handle("aten::t");
  return one_tensor_view(op, keys, self, [](const at::Tensor& local) { return local.t(); });
}

at::Tensor fast_detach(c10::DispatchKeySet keys, const at::Tensor& self) {
  static const c10::OperatorHandle op = handle("aten::detach");
  // A DTensor still arriving (a gradient whose reduce-scatter is in flight) stays so: autograd detaches
  // each gradient it stores, and that must not wait for the transfer. The copy shares the wait.
  if (const DTensorImpl* impl = as_dtensor(self); impl != nullptr && impl->local_pending())
    return at::Tensor(impl->shallow_copy_and_detach(impl->version_counter(), impl->allow_tensor_metadata_change()));
  return one_tensor_view(op, keys, self, [](const at::Tensor& local) { return local.detach(); });
}

}  // namespace

bool register_fast_kernel(torch::Library& library, const std::string& qualified) {
  if (qualified == "aten::t") library.impl("t", TORCH_FN(fast_t));
  else if (qualified == "aten::detach") library.impl("detach", TORCH_FN(fast_detach));
  else return false;
  return true;
}

}  // namespace dtensor::detail
