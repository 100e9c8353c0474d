#pragma once
// World: the processes of one job (this one's rank, how many, and a store through which they meet)
// and the factory for process groups over subsets of them. Launch-agnostic: built from whatever
// environment started the process (dtensor's own launcher, torchrun --no-python, or mpirun).

#include <c10/core/DeviceType.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtensor/comm_backend.h"

namespace c10d {
class Store;
class Backend;
}  // namespace c10d

namespace dtensor {
namespace detail {
class MeshGroup;
class PeerWatch;
}  // namespace detail

struct WorldOptions {
  // How long a collective (and the rendezvous) may wait before failing with an error. Default: the
  // environment variable DTENSOR_TIMEOUT_S, else 300 s.
  std::chrono::milliseconds timeout{0};
};

class World {
 public:
  // Joins the job this process belongs to, read from the environment:
  //  - RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (dtensor's launcher and torchrun; with
  //    TORCHELASTIC_USE_AGENT_STORE=True the store server already runs, every rank is a client);
  //  - OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (mpirun; the store is MASTER_ADDR:MASTER_PORT when
  //    set, else a file store in /tmp keyed by the MPI job id). When dtensor has MPI this also
  //    initializes it, and CPU meshes then use the MPI backend unless told otherwise.
  // Throws DTensorError naming the variables when none of these is present.
  static std::shared_ptr<World> from_environment(WorldOptions options = {});

  World(c10::intrusive_ptr<c10d::Store> store, int rank, int size, WorldOptions options = {});
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The job's store; for a non-empty `channel`, a connection of its own to it (made at first use), so
  // that a thread agreeing on that channel never queues behind another thread's blocking wait (c10d's
  // TCPStore client serves one request at a time).
  c10::intrusive_ptr<c10d::Store> store(const std::string& channel = "") const;
  // Which environment started this process: "dtensor", "dtensor via mpirun", "torchrun", "mpirun" or
  // "manual".
  const std::string& launcher() const { return launcher_; }
  // Whether mpirun started this process (its world is MPI_COMM_WORLD's).
  bool started_by_mpirun() const { return started_by_mpirun_; }
  // The backend `requested` means for meshes of `device` in this world. Automatic: CPU meshes use
  // DTENSOR_BACKEND when set; else the registered backend for the device that prefers this world (MPI
  // when mpirun started it), else the device's default (Gloo for CPU, NCCL for CUDA). Other values are
  // checked against the registered backends and returned as they are.
  CommBackend resolve(CommBackend requested, c10::DeviceType device) const;

  // The sum of `value` over every rank of the world, on every rank (through the store, so it needs no
  // process group): how the ranks of a job agree on a verdict, so that each exits with it. Every rank
  // must call it the same number of times.
  // Calls on different `channel`s are independent (each counts its own calls and has its own store
  // connection), so a thread of its own (an asynchronous checkpoint save) can agree on one while the
  // job's thread uses another.
  // `patience`: how long the agreement may take while the awaited peers are alive (beating in the
  // store's heartbeats), for agreements some ranks reach long after others: a job's verdict, which waits
  // while rank 0 alone runs its oracle. The peers are checked after each wait of the world's timeout,
  // so one that exits or falls silent is named within about two of them. Zero, or less than the
  // world's timeout: the world's timeout.
  int64_t sum_across_ranks(int64_t value, const std::string& channel = "", std::chrono::milliseconds patience = {});
  // Every rank's `value`, by rank, on every rank (through the store, as sum_across_ranks, whose calls
  // it shares the count of on each channel). Rank 0, which may host the store, returns only once
  // every rank has read every value, so that a job may exit right after its last agreement.
  std::vector<std::string> gather_across_ranks(const std::string& value, const std::string& channel = "",
                                               std::chrono::milliseconds patience = {});

  // Which of `ranks` are not answering and why, each named with its host, for an error message: exited
  // or stopped (on this host), left the job, silent in the store's heartbeats for a few beats (hung,
  // stopped, or its host down or cut off), or unreachable because this rank's own link to the store is
  // down. Read from memory (a background thread keeps it current), so it never waits on the network;
  // with `settle` it first waits up to a few beats for a peer that just failed to show as silent.
  // Empty when every one of them is alive.
  std::string describe_peers(const std::vector<int64_t>& ranks, bool settle) const;

  // A process group over `ranks` (sorted global ranks, this rank among them) on `backend` (resolved
  // as above). Every member must create groups over the same rank set in the same order; distinct
  // rank sets never wait on each other.
  c10::intrusive_ptr<c10d::Backend> new_group(const std::vector<int64_t>& ranks, c10::DeviceType device,
                                               std::chrono::milliseconds timeout,
                                               CommBackend backend = CommBackend::Automatic);
  // The same, held for a mesh; World::shutdown shuts it down wherever it still lives.
  std::shared_ptr<detail::MeshGroup> new_mesh_group(const std::vector<int64_t>& ranks, c10::DeviceType device,
                                                    std::chrono::milliseconds timeout,
                                                    CommBackend backend = CommBackend::Automatic);

  // Shuts down every process group made through this world (meshes built on it then refuse
  // collectives) and closes its store. Creating groups afterwards is an error. Idempotent; the
  // destructor does it too.
  void shutdown();

 private:
  // Waits for `key`, rank `peer`'s value in an agreement, until `deadline` (the agreement's) as
  // gather_across_ranks's `patience` says.
  void wait_for_agreement(c10d::Store& store, const std::string& key, int peer, std::chrono::steady_clock::time_point deadline,
                          std::chrono::milliseconds patience) const;

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::string launcher_ = "manual";
  bool started_by_mpirun_ = false;
  mutable std::mutex mutex_;
  mutable std::map<std::string, c10::intrusive_ptr<c10d::Store>> channel_stores_;  // under mutex_
  std::map<std::vector<int64_t>, int> groups_created_;
  std::map<std::string, int64_t> agreements_done_;  // per channel; under mutex_
  std::vector<std::weak_ptr<detail::MeshGroup>> mesh_groups_;
  mutable std::mutex watch_mutex_;
  std::unique_ptr<detail::PeerWatch> watch_;
  bool shut_down_ = false;  // per rank set, so each group gets a fresh store prefix
};

// This machine's host name: how errors name where a rank runs, and how node-local checkpoints tell
// the nodes (and so their directories) apart.
std::string host_name();

// The timeout DTENSOR_TIMEOUT_S asks for (seconds, 0.001 to 1e9; anything else is refused), else `fallback`.
std::chrono::milliseconds timeout_from_environment(std::chrono::milliseconds fallback);

}  // namespace dtensor
