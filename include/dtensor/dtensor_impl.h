#pragma once
// DTensorImpl: the TensorImpl behind a DTensor. An at::Tensor whose sizes/strides/dtype are the
// global tensor's, whose device is the local shard's, which has no storage of its own (touching it
// throws), and which carries dispatch keys {PrivateUse2, AutogradPrivateUse2}: aten ops on it reach
// dtensor's kernels, and autograd's formulas run on top of it.
//
// PrivateUse2 rather than PrivateUse1: out-of-tree device backends use PrivateUse1, and a DTensor
// wraps tensors of any device.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "dtensor/spec.h"

namespace dtensor {

constexpr c10::DispatchKey kDTensorKey = c10::DispatchKey::PrivateUse2;

namespace detail {
struct PendingLocal;
}

class DTensorImpl final : public c10::TensorImpl {
 public:
  // `local` must carry no autograd history (autograd lives on the DTensor itself). Specs are shared
  // (immutable) so that wrapping an op's output costs no copy of the spec.
  DTensorImpl(at::Tensor local, std::shared_ptr<const DTensorSpec> spec);
  // A DTensor whose local tensor is still arriving (a collective started with async_op): the first
  // use of local() waits for it. `placeholder` gives its dtype and device until then.
  DTensorImpl(at::Tensor placeholder, std::shared_ptr<const DTensorSpec> spec,
              std::shared_ptr<detail::PendingLocal> pending);

  const at::Tensor& local() const {
    if (pending_) [[unlikely]]
      wait_for_local();
    return local_;
  }
  // Whether the local tensor is still arriving (local() would wait).
  bool local_pending() const { return pending_ != nullptr; }
  const DTensorSpec& spec() const { return *spec_; }
  const std::shared_ptr<const DTensorSpec>& shared_spec() const { return spec_; }

  // For in-place ops that change the DTensor's layout but keep its local buffer: an in-place view
  // (t_, unsqueeze_: the local tensor was changed alike) or a Partial tensor reduced in place before
  // it is written. `spec` must describe the (already updated) local tensor.
  void reset_spec(std::shared_ptr<const DTensorSpec> spec);

  // Autograd saves and detaches tensors through these; without them the copy would be a plain
  // TensorImpl still carrying the DTensor key, and the next op on it would recurse forever.
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  const char* tensorimpl_type_name() const override { return "DTensorImpl"; }
  template <typename Version>
  c10::intrusive_ptr<c10::TensorImpl> copy_with_version(Version&& version, bool allow_tensor_metadata_change) const;

  void wait_for_local() const;

  // Filled in by the first local() of a pending DTensor (what every reader goes through).
  mutable at::Tensor local_;
  mutable std::shared_ptr<detail::PendingLocal> pending_;
  std::shared_ptr<const DTensorSpec> spec_;
};

// Wraps a local shard as a DTensor without communication or checks (the caller vouches for `spec`).
// The local tensor is aliased, never copied; its autograd history is not carried over.
at::Tensor make_dtensor(const at::Tensor& local, std::shared_ptr<const DTensorSpec> spec);
at::Tensor make_dtensor(const at::Tensor& local, DTensorSpec spec);

bool is_dtensor(const at::Tensor& tensor);
// The impl of a DTensor; throws DTensorError naming `what` when `tensor` is not one.
const DTensorImpl& dtensor_impl(const at::Tensor& tensor, const char* what = "this operation");

// `local` laid out in the dim order its DTensor's global strides give (`meta`): `local` itself when it
// already is (or is not dense, as views of a shard are), else a dense copy in that order. New shards
// (op results, redistributed and gradient shards) go through this, so that any view that is legal on
// the global tensor is legal on its shard and aliases it, instead of silently copying.
at::Tensor in_global_layout(const at::Tensor& local, const TensorMeta& meta);

// A new TensorImpl sharing `tensor`'s storage and version counter but none of its autograd history.
at::Tensor alias_without_history(const at::Tensor& tensor);

}  // namespace dtensor
