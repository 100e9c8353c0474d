// The conjugate and negative bits of a DTensor (at::conj, and _neg_view inside complex autograd
// formulas) live on its shard. LibTorch's own _conj sets the bit on the tensor it is given: on a
// DTensor that is the wrapper, which everything that unwraps the shard never looks at: to_local, and
// the ops LibTorch lets through the Conjugate key unresolved because their kernels read the bit
// themselves (mm, matmul, ...), which then computed with unconjugated values (a silent wrong answer).
// With the bit on the shard, every op on the shard honours it as on one device.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "dtensor/dtensor_impl.h"

namespace dtensor::rules {
namespace {

at::Tensor conj_view(const at::Tensor& self) {
  const DTensorImpl& impl = dtensor_impl(self, "aten::_conj");
  return make_dtensor(impl.local()._conj(), impl.shared_spec());
}

at::Tensor neg_view(const at::Tensor& self) {
  const DTensorImpl& impl = dtensor_impl(self, "aten::_neg_view");
  return make_dtensor(impl.local()._neg_view(), impl.shared_spec());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse2, m) {
  m.impl("_conj", TORCH_FN(conj_view));
  m.impl("_neg_view", TORCH_FN(neg_view));
}

}  // namespace
}  // namespace dtensor::rules
