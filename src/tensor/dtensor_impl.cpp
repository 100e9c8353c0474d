#include "dtensor/dtensor_impl.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <vector>

#include "as_dtensor.h"
#include "dtensor/errors.h"
#include "pending_local.h"

namespace dtensor {

DTensorImpl::DTensorImpl(at::Tensor local, std::shared_ptr<const DTensorSpec> spec)
    : c10::TensorImpl(c10::DispatchKeySet(kDTensorKey), local.dtype(), local.device()),
      local_(std::move(local)),
      spec_(std::move(spec)) {
  set_storage_access_should_throw();
  set_sizes_and_strides(spec_->meta.shape, spec_->meta.stride);
}

DTensorImpl::DTensorImpl(at::Tensor placeholder, std::shared_ptr<const DTensorSpec> spec,
                         std::shared_ptr<detail::PendingLocal> pending)
    : DTensorImpl(std::move(placeholder), std::move(spec)) {
  pending_ = std::move(pending);
}

void DTensorImpl::wait_for_local() const {
  local_ = pending_->get();
  pending_.reset();
}

void DTensorImpl::reset_spec(std::shared_ptr<const DTensorSpec> spec) {
  spec_ = std::move(spec);
  set_sizes_and_strides(spec_->meta.shape, spec_->meta.stride);
}

template <typename Version>
c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::copy_with_version(Version&& version,
                                                                   bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<DTensorImpl>(local_, spec_, pending_);
  copy_tensor_metadata(this, impl.get(), std::forward<Version>(version), allow_tensor_metadata_change);
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                                         bool allow_tensor_metadata_change) const {
  return copy_with_version(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                                         bool allow_tensor_metadata_change) const {
  return copy_with_version(std::move(version_counter), allow_tensor_metadata_change);
}

void DTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  const auto* other = dynamic_cast<const DTensorImpl*>(impl.get());
  if (other == nullptr) throw DTensorError("set_data: a DTensor's data can only be replaced by another DTensor");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  local_ = other->local_;
  pending_ = other->pending_;
  spec_ = other->spec_;
}

namespace {
std::vector<void (*)()>& first_dtensor_actions() {
  static std::vector<void (*)()> actions;
  return actions;
}

// The DTensor over `local` (a placeholder while `pending`), running the actions registered for the
// first one before it exists.
at::Tensor new_dtensor(at::Tensor local, std::shared_ptr<const DTensorSpec> spec,
                       std::shared_ptr<detail::PendingLocal> pending = nullptr) {
  static const bool ran = [] {
    for (auto action : first_dtensor_actions()) action();
    return true;
  }();
  (void)ran;
  return at::Tensor(c10::make_intrusive<DTensorImpl>(std::move(local), std::move(spec), std::move(pending)));
}
}  // namespace

void detail::before_first_dtensor(void (*action)()) { first_dtensor_actions().push_back(action); }

at::Tensor make_dtensor(const at::Tensor& local, std::shared_ptr<const DTensorSpec> spec) {
  return new_dtensor(alias_without_history(local), std::move(spec));
}

at::Tensor make_dtensor(const at::Tensor& local, DTensorSpec spec) {
  return make_dtensor(local, std::make_shared<const DTensorSpec>(std::move(spec)));
}

at::Tensor detail::make_pending_dtensor(std::shared_ptr<const DTensorSpec> spec, const at::TensorOptions& options,
                                        std::function<at::Tensor()> finish) {
  return new_dtensor(at::empty({0}, options), std::move(spec), std::make_shared<PendingLocal>(std::move(finish)));
}

namespace detail {

at::Tensor wrap_local(at::Tensor local, std::shared_ptr<const DTensorSpec> spec) {
  if (local.use_count() == 1 && local.unsafeGetTensorImpl()->autograd_meta() == nullptr)
    return new_dtensor(std::move(local), std::move(spec));
  return make_dtensor(local, std::move(spec));
}
// Asked of every argument of every op on DTensors: the dispatch key rules plain tensors out at once,
// and DTensorImpl is final, so an exact type match is the whole check (cheaper than a dynamic_cast).
const DTensorImpl* as_dtensor(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->key_set().has(kDTensorKey) || typeid(*impl) != typeid(DTensorImpl)) return nullptr;
  return static_cast<const DTensorImpl*>(impl);
}
}  // namespace detail

bool is_dtensor(const at::Tensor& tensor) { return detail::as_dtensor(tensor) != nullptr; }

const DTensorImpl& dtensor_impl(const at::Tensor& tensor, const char* what) {
  const DTensorImpl* impl = detail::as_dtensor(tensor);
  if (impl == nullptr) {
    throw DTensorError(std::string(what) + " expects a DTensor but got " +
                       (tensor.defined() ? "a plain tensor" : "an undefined tensor") +
                       "; make one with distribute_tensor or from_local");
  }
  return *impl;
}

namespace {
// As at::Tensor::is_contiguous: row-major strides, those of size-1 dims not counted.
bool is_contiguous_layout(const TensorMeta& meta) {
  int64_t expected = 1;
  for (size_t d = meta.shape.size(); d-- > 0;) {
    if (meta.shape[d] == 1) continue;
    if (meta.stride[d] != expected) return false;
    expected *= meta.shape[d];
  }
  return true;
}
}  // namespace

at::Tensor in_global_layout(const at::Tensor& local, const TensorMeta& meta) {
  if (!local.defined() || local.numel() <= 1 || !local.is_non_overlapping_and_dense() ||
      static_cast<size_t>(local.dim()) != meta.shape.size())
    return local;
  // Every op result comes through here: answer the common case (dense in the global dim order, which
  // for a contiguous global tensor means contiguous) without building the expected strides.
  if (local.is_contiguous() && is_contiguous_layout(meta)) return local;
  const Shape expected = global_stride_like(local.sizes().vec(), meta.shape, meta.stride);
  for (int64_t d = 0; d < local.dim(); ++d)
    if (local.size(d) > 1 && local.stride(d) != expected[d])
      return at::empty_strided(local.sizes(), expected, local.options()).copy_(local);
  return local;
}

at::Tensor alias_without_history(const at::Tensor& tensor) {
  if (!tensor.defined()) return tensor;
  auto* impl = tensor.unsafeGetTensorImpl();
  return at::Tensor(impl->shallow_copy_and_detach(impl->version_counter(), /*allow_tensor_metadata_change=*/true));
}

namespace {

// Any aten op without a dtensor kernel lands here: say which op, with which DTensor inputs, and the
// ways out, instead of touching the (absent) storage.
void no_kernel_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto args = torch::jit::last(*stack, schema.arguments().size());
  std::string inputs;
  for (const auto& arg : args) {
    if (!arg.isTensor() || !is_dtensor(arg.toTensor())) continue;
    inputs += (inputs.empty() ? "" : "; ") + dtensor_impl(arg.toTensor()).spec().str();
  }
  throw DTensorError("no sharding strategy for op " + schema.operator_name().name +
                     (schema.overload_name().empty() ? "" : "." + schema.overload_name()) + " on DTensor inputs (" +
                     inputs + "). Ways out: run it on local shards (to_local / full_tensor, then from_local), or "
                     "register a sharding strategy for the op");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse2, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&no_kernel_fallback>()); }

// LibTorch gives the autograd keys of in-tree backends a fallback for ops without autograd formulas
// (custom ops); PrivateUse2's needs one too, the same one: it runs the op and errors only when a
// gradient is actually needed.
TORCH_LIBRARY_IMPL(_, AutogradPrivateUse2, m) { m.fallback(torch::autograd::basicAutogradNotImplementedFallback()); }

}  // namespace dtensor
