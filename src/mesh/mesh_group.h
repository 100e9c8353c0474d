#pragma once
// One mesh dim's process group, shared by the mesh and its slices (and tracked by the world). It is
// released when its last holder goes or when the mesh or the world is shut down, whichever comes
// first; using it after that is an error, not a hang. It also refuses a collective started while
// another thread is inside one on the same group: every rank must issue a group's collectives in one
// order, which two threads racing on it cannot guarantee.

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace c10d {
class Backend;
}

namespace dtensor::detail {

class MeshGroup {
 public:
  // `borrowed`: the caller made the backend (DeviceMesh::from_group) and keeps it; shutdown and the
  // destructor drop the reference without shutting the backend down.
  explicit MeshGroup(c10::intrusive_ptr<c10d::Backend> backend, bool borrowed = false);
  ~MeshGroup();
  MeshGroup(const MeshGroup&) = delete;
  MeshGroup& operator=(const MeshGroup&) = delete;

  // Names the group in errors (built only when one is raised).
  using Where = std::function<std::string()>;

  // The backend; throws DTensorError naming `where` once the group has been shut down.
  c10::intrusive_ptr<c10d::Backend> backend(const Where& where) const;
  // Shuts the backend down and drops it (its threads and sockets go with the last reference).
  void shutdown();

  // Marks this thread as inside a collective on the group for the guard's lifetime; throws
  // DTensorError naming `where` when another thread is inside one.
  class Exclusive {
   public:
    Exclusive(MeshGroup& group, const Where& where);
    ~Exclusive();
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;

   private:
    MeshGroup& group_;
    bool nested_;
  };

 private:
  mutable std::mutex mutex_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  const bool borrowed_;
  std::atomic<std::thread::id> user_{};
};

}  // namespace dtensor::detail
