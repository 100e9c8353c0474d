#pragma once
// Makes one c10d backend for a group of ranks that meet through `store`. Kept in its own files so
// that only one translation unit needs Gloo's (and NCCL's) headers.

#include <c10/core/DeviceType.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "dtensor/comm_backend.h"

namespace c10d {
class Store;
class Backend;
}  // namespace c10d

namespace dtensor::detail {

// `ranks` are the members' sorted world ranks and `world_rank` this process's; `backend` is resolved
// (not Automatic).
c10::intrusive_ptr<c10d::Backend> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int64_t>& ranks, int world_rank,
                                                     c10::DeviceType device, CommBackend backend,
                                                     std::chrono::milliseconds timeout);

}  // namespace dtensor::detail
