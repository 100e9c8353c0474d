#pragma once
// A DTensor's local tensor that is still arriving: a collective started with async_op, and what turns
// its result into the local tensor. The DTensor waits for it at the first use of its local tensor
// (DTensorImpl::local(), which every op, to_local and local_tensor_of go through).

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <mutex>

#include "dtensor/spec.h"

namespace dtensor::detail {

struct PendingLocal {
  explicit PendingLocal(std::function<at::Tensor()> finish) : finish(std::move(finish)) {}
  // Runs `finish` once (a failure is thrown to each caller until it succeeds) and returns its result.
  const at::Tensor& get() {
    std::lock_guard<std::mutex> lock(mutex);
    if (finish) {
      result = finish();
      finish = nullptr;
    }
    return result;
  }

  std::mutex mutex;
  std::function<at::Tensor()> finish;
  at::Tensor result;
};

// A DTensor with `spec` whose local tensor (of dtype and device `options`) `finish` waits for and
// returns, at its first use.
at::Tensor make_pending_dtensor(std::shared_ptr<const DTensorSpec> spec, const at::TensorOptions& options,
                                std::function<at::Tensor()> finish);

}  // namespace dtensor::detail
