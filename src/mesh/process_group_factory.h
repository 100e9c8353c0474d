#pragma once
// Makes one c10d backend for a group of ranks that meet through `store`. Kept in its own files so
// that only one translation unit needs Gloo's (and NCCL's) headers.

#include <c10/core/DeviceType.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>

namespace c10d {
class Store;
class Backend;
}  // namespace c10d

namespace dtensor::detail {

c10::intrusive_ptr<c10d::Backend> make_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                     int size, c10::DeviceType device,
                                                     std::chrono::milliseconds timeout);

}  // namespace dtensor::detail
