#include "fast_kernels.h"

#include <ATen/ATen.h>
#include <torch/library.h>

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

// One DTensor in, one DTensor out, and a cached decision that asks for nothing but the op on the shard
// (no input moved, no argument or kernel of its own but a rewritten size): the op runs on the shard
// and the result is wrapped, with the spec the general kernel would give it. Anything else (and any
// call on a rank outside the mesh) takes the general kernel. `local_op(shard, size)` gets the
// size argument as the decision rewrote it for the shard (null when the op has none).
template <typename LocalOp>
at::Tensor one_tensor_op(const c10::OperatorHandle& op, c10::DispatchKeySet keys, c10::ArrayRef<c10::IValue> args,
                         bool is_view, LocalOp&& local_op) {
  const DTensorImpl* impl = as_dtensor(args[0].toTensor());
  if (impl == nullptr || !impl->spec().mesh->contains_this_rank()) return general(op, keys, args);
  const std::vector<TensorInput> inputs = {TensorInput{0, -1, impl->shared_spec()}};
  const OutputSharding& decision = propagate(op, args, inputs, impl->spec().mesh);
  const c10::IValue* size = args.size() > 1 ? &args[1] : nullptr;
  for (const auto& [index, value] : decision.local_args) {
    if (index != 1) return general(op, keys, args);
    size = &value;
  }
  if (decision.input_moves[0] || decision.local_kernel || decision.outputs.size() != 1) return general(op, keys, args);
  record_op_for_debug(op, inputs);
  at::Tensor local = local_op(impl->local(), size);
  if (!is_view) local = in_global_layout(local, decision.outputs[0].meta);
  // The shard result is new (a view or a fresh tensor the op made), so it needs no alias of its own.
  return at::Tensor(
      c10::make_intrusive<DTensorImpl>(std::move(local), with_mesh(decision.outputs[0], impl->spec().mesh, inputs)));
}

c10::OperatorHandle handle(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

at::Tensor fast_t(c10::DispatchKeySet keys, const at::Tensor& self) {
  static const c10::OperatorHandle op = handle("aten::t");
  const c10::IValue args[] = {self};
  return one_tensor_op(op, keys, args, true, [](const at::Tensor& local, const c10::IValue*) { return local.t(); });
}

at::Tensor fast_detach(c10::DispatchKeySet keys, const at::Tensor& self) {
  static const c10::OperatorHandle op = handle("aten::detach");
  const c10::IValue args[] = {self};
  return one_tensor_op(op, keys, args, true, [](const at::Tensor& local, const c10::IValue*) { return local.detach(); });
}

at::Tensor fast_view(c10::DispatchKeySet keys, const at::Tensor& self, c10::SymIntArrayRef size) {
  static const c10::OperatorHandle op = handle("aten::view");
  const c10::IValue args[] = {self, size};
  return one_tensor_op(op, keys, args, true, [](const at::Tensor& local, const c10::IValue* shape) {
    return local.view(shape->toIntVector());
  });
}

at::Tensor fast_unsafe_view(c10::DispatchKeySet keys, const at::Tensor& self, c10::SymIntArrayRef size) {
  static const c10::OperatorHandle op = handle("aten::_unsafe_view");
  const c10::IValue args[] = {self, size};
  return one_tensor_op(op, keys, args, false, [](const at::Tensor& local, const c10::IValue* shape) {
    return at::_unsafe_view(local, shape->toIntVector());
  });
}

}  // namespace

bool register_fast_kernel(torch::Library& library, const std::string& qualified) {
  if (qualified == "aten::t") library.impl("t", TORCH_FN(fast_t));
  else if (qualified == "aten::detach") library.impl("detach", TORCH_FN(fast_detach));
  else if (qualified == "aten::view") library.impl("view", TORCH_FN(fast_view));
  else if (qualified == "aten::_unsafe_view") library.impl("_unsafe_view", TORCH_FN(fast_unsafe_view));
  else return false;
  return true;
}

}  // namespace dtensor::detail
