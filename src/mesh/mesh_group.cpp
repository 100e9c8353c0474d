#include "mesh_group.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "dtensor/errors.h"

namespace dtensor::detail {

MeshGroup::MeshGroup(c10::intrusive_ptr<c10d::Backend> backend, bool borrowed)
    : backend_(std::move(backend)), borrowed_(borrowed) {}

MeshGroup::~MeshGroup() { shutdown(); }

c10::intrusive_ptr<c10d::Backend> MeshGroup::backend(const Where& where) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!backend_)
    throw DTensorError(where() + ": the mesh's process groups were shut down (DeviceMesh::shutdown or World::shutdown); "
                               "create a new mesh");
  return backend_;
}

void MeshGroup::shutdown() {
  c10::intrusive_ptr<c10d::Backend> backend;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    backend = std::move(backend_);
  }
  // NCCL needs an explicit shutdown (it warns or hangs at exit otherwise); Gloo releases its threads
  // and sockets in its destructor, when this last reference goes.
  if (backend && !borrowed_) backend->shutdown();
}

MeshGroup::Exclusive::Exclusive(MeshGroup& group, const Where& where) : group_(group) {
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id nobody{};
  if (group_.user_.compare_exchange_strong(nobody, me)) {
    nested_ = false;
    return;
  }
  if (nobody == me) {  // a collective inside a collective on this thread (never happens today)
    nested_ = true;
    return;
  }
  throw DTensorError(where() + ": another thread of this rank is running a collective on the same process group. "
                             "Every rank must issue a mesh's collectives in one order, which racing threads cannot "
                             "guarantee: run them from one thread at a time, or give each thread a mesh of its own");
}

MeshGroup::Exclusive::~Exclusive() {
  if (!nested_) group_.user_.store(std::thread::id{});
}

}  // namespace dtensor::detail
