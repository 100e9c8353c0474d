// NCCL: CUDA tensors; the default for CUDA meshes, in builds with -DDTENSOR_WITH_NCCL=ON.

#ifdef DTENSOR_WITH_NCCL

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "dtensor/comm_backend.h"

namespace dtensor {
namespace {

[[maybe_unused]] const bool kRegistered = (register_comm_backend({
    .backend = CommBackend::Nccl,
    .device = c10::DeviceType::CUDA,
    .c10d_type = static_cast<int>(c10d::ProcessGroup::BackendType::NCCL),
    .default_for_device = true,
    .make_group = [](const CommBackendDescription::GroupRequest& request) -> c10::intrusive_ptr<c10d::Backend> {
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = request.timeout;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(request.store, request.rank,
                                                         static_cast<int>(request.ranks.size()), options);
    },
}), true);

}  // namespace
}  // namespace dtensor

#endif
