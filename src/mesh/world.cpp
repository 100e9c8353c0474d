#include "dtensor/world.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "dtensor/errors.h"
#include "backend_environment.h"
#include "mesh_group.h"

namespace dtensor {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int env_int(const char* name) {
  const auto v = env(name);
  try {
    return std::stoi(*v);
  } catch (const std::exception&) {
    throw DTensorError(std::string("environment variable ") + name + "='" + *v + "' is not an integer");
  }
}

c10::intrusive_ptr<c10d::Store> tcp_store(int rank, int size, bool server_runs_elsewhere,
                                          std::chrono::milliseconds timeout) {
  const auto addr = env("MASTER_ADDR");
  if (!addr || !env("MASTER_PORT"))
    throw DTensorError("RANK/WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is not; set both (torchrun does)");
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env_int("MASTER_PORT"));
  options.isServer = rank == 0 && !server_runs_elsewhere;
  options.numWorkers = size;
  options.waitWorkers = false;
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(*addr, options);
}

}  // namespace

std::chrono::milliseconds timeout_from_environment(std::chrono::milliseconds fallback) {
  if (const auto v = env("DTENSOR_TIMEOUT_S")) {
    try {
      return std::chrono::milliseconds(static_cast<int64_t>(std::stod(*v) * 1000));
    } catch (const std::exception&) {
      throw DTensorError("DTENSOR_TIMEOUT_S='" + *v + "' is not a number of seconds");
    }
  }
  return fallback;
}

namespace {

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

std::string process_key(int64_t rank) { return "dtensor/process/" + std::to_string(rank); }

// Whether process `pid` on this host has exited: no such process, or a zombie not yet reaped.
bool process_exited(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  stat >> pid_field >> comm >> state;  // comm has no spaces for our ranks' executables
  return state == "Z" || state == "X";
}

}  // namespace

World::World(c10::intrusive_ptr<c10d::Store> store, int rank, int size, WorldOptions options)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      timeout_(options.timeout.count() > 0 ? options.timeout : timeout_from_environment(std::chrono::seconds(300))) {
  if (size <= 0 || rank < 0 || rank >= size)
    throw DTensorError("World: rank " + std::to_string(rank) + " is not in [0, " + std::to_string(size) + ")");
  // A peer that dies closes its sockets; writing to one must fail as an error Gloo reports, not kill
  // this process with SIGPIPE (Python, which torchrun-launched PyTorch runs under, ignores it too).
  signal(SIGPIPE, SIG_IGN);
  // So that a peer's failed collective can say this process is the one that went away.
  const std::string me = host_name() + " " + std::to_string(getpid());
  store_->set(process_key(rank), std::vector<uint8_t>(me.begin(), me.end()));
}

std::vector<int64_t> World::exited_ranks(const std::vector<int64_t>& ranks) const {
  std::vector<int64_t> out;
  if (!store_) return out;
  const std::string here = host_name();
  for (int64_t r : ranks) {
    if (r == rank_) continue;
    try {
      if (!store_->check({process_key(r)})) continue;
      const auto bytes = store_->get(process_key(r));
      std::istringstream entry(std::string(bytes.begin(), bytes.end()));
      std::string host;
      int64_t pid = 0;
      entry >> host >> pid;
      if (host == here && pid > 0 && process_exited(pid)) out.push_back(r);
    } catch (const std::exception&) {
      // the store itself may be gone with the peer that served it; nothing more to say
    }
  }
  return out;
}

World::~World() { shutdown(); }

c10::intrusive_ptr<c10d::Store> World::store() const {
  if (!store_) throw DTensorError("rank " + std::to_string(rank_) + ": the world was shut down; it has no store");
  return store_;
}

void World::shutdown() {
  std::vector<std::shared_ptr<detail::MeshGroup>> live;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shut_down_ = true;
    for (const auto& g : mesh_groups_)
      if (auto group = g.lock()) live.push_back(std::move(group));
    mesh_groups_.clear();
  }
  for (const auto& g : live) g->shutdown();
  store_.reset();
}

std::shared_ptr<detail::MeshGroup> World::new_mesh_group(const std::vector<int64_t>& ranks, c10::DeviceType device,
                                                         std::chrono::milliseconds timeout, CommBackend backend) {
  auto group = std::make_shared<detail::MeshGroup>(new_group(ranks, device, timeout, backend));
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(mesh_groups_, [](const auto& g) { return g.expired(); });
  mesh_groups_.push_back(group);
  return group;
}

std::shared_ptr<World> World::from_environment(WorldOptions options) {
  const auto timeout = options.timeout.count() > 0 ? options.timeout : timeout_from_environment(std::chrono::seconds(300));
  options.timeout = timeout;
  std::shared_ptr<World> world;
  std::string launcher;
  if (env("RANK") && env("WORLD_SIZE")) {
    const int rank = env_int("RANK"), size = env_int("WORLD_SIZE");
    const bool agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    world = std::make_shared<World>(tcp_store(rank, size, agent_store, timeout), rank, size, options);
    launcher = env("DTENSOR_LAUNCHED") ? "dtensor" : "torchrun";
  } else if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    const int rank = env_int("OMPI_COMM_WORLD_RANK"), size = env_int("OMPI_COMM_WORLD_SIZE");
    c10::intrusive_ptr<c10d::Store> store;
    if (env("MASTER_ADDR") && env("MASTER_PORT")) {
      // dtensor's launcher, when it starts the ranks through mpirun, holds the store itself.
      const bool launcher_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
      store = tcp_store(rank, size, launcher_store, timeout);
    } else {
      // One mpirun job = one id; all its ranks share this machine's /tmp when run locally.
      const auto job = env("OMPI_MCA_ess_base_jobid").value_or(env("PMIX_NAMESPACE").value_or(""));
      if (job.empty())
        throw DTensorError("mpirun environment without a job id (OMPI_MCA_ess_base_jobid / PMIX_NAMESPACE); "
                           "set MASTER_ADDR and MASTER_PORT so the ranks can meet over TCP");
      std::string path = "/tmp/dtensor-store-" + job;
      std::replace(path.begin() + 5, path.end(), '/', '_');
      store = c10::make_intrusive<c10d::FileStore>(path, size);
    }
    world = std::make_shared<World>(store, rank, size, options);
    launcher = env("DTENSOR_LAUNCHED") ? "dtensor via mpirun" : "mpirun";
    world->started_by_mpirun_ = true;
  } else {
    throw DTensorError("this process was not started as a rank: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                       "(torchrun does), run under mpirun, or start the program through dtensor::run_local_ranks");
  }
  world->launcher_ = launcher;
  for (const auto& backend : detail::comm_backends())
    if (backend.on_world_started) backend.on_world_started(*world);
  return world;
}

int64_t World::sum_across_ranks(int64_t value) {
  const auto store = this->store();
  const std::string prefix = "dtensor/sum/" + std::to_string(sums_done_++) + "/";
  const std::string mine = std::to_string(value);
  store->set(prefix + std::to_string(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    const std::string key = prefix + std::to_string(r);
    try {
      store->wait({key}, timeout_);
    } catch (const std::exception& e) {
      const bool exited = !exited_ranks({r}).empty();
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      throw DTensorError("rank " + std::to_string(rank_) + ": sum_across_ranks: rank " + std::to_string(r) +
                         (exited ? " did not report: its process has exited"
                                 : " did not report within the world's timeout (" +
                                       std::string(c10_error ? c10_error->what_without_backtrace() : e.what()) + ")"));
    }
    const auto bytes = store->get(key);
    total += std::stoll(std::string(bytes.begin(), bytes.end()));
  }
  return total;
}

CommBackend World::resolve(CommBackend requested, c10::DeviceType device) const {
  if (requested != CommBackend::Automatic) return comm_backend_description(requested).backend;
  if (device == c10::DeviceType::CPU)
    if (const auto asked = detail::backend_from_environment()) return *asked;
  std::optional<CommBackend> fallback;
  for (const auto& backend : detail::comm_backends()) {
    if (backend.device != device) continue;
    if (backend.prefers && backend.prefers(*this)) return backend.backend;
    if (backend.default_for_device) fallback = backend.backend;
  }
  if (fallback) return *fallback;
  throw DTensorError("rank " + std::to_string(rank_) + ": no communication backend for " + c10::DeviceTypeName(device, true) +
                     " meshes in this build of dtensor" +
                     (device == c10::DeviceType::CUDA ? " (NCCL: reconfigure with -DDTENSOR_WITH_NCCL=ON on a machine with the "
                                                        "CUDA toolkit), or use a CPU mesh"
                                                      : ""));
}

c10::intrusive_ptr<c10d::Backend> World::new_group(const std::vector<int64_t>& ranks, c10::DeviceType device,
                                                   std::chrono::milliseconds timeout, CommBackend backend) {
  const CommBackendDescription& description = comm_backend_description(resolve(backend, device));
  if (description.device != device)
    throw DTensorError("rank " + std::to_string(rank_) + ": the " + to_string(description.backend) + " backend carries " +
                       c10::DeviceTypeName(description.device, true) + " tensors, not " + c10::DeviceTypeName(device, true) +
                       " ones; use " + comm_backends_for(device));
  if (description.check_world) description.check_world(*this);
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) throw DTensorError("World::new_group: rank " + std::to_string(rank_) + " is not a member");
  int serial = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shut_down_)
      throw DTensorError("rank " + std::to_string(rank_) + ": the world was shut down; it cannot create process groups");
    serial = groups_created_[ranks]++;
  }
  std::string prefix = "dtensor/group";
  for (auto r : ranks) prefix += "-" + std::to_string(r);
  prefix += "/" + std::to_string(serial);
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, this->store());
  const int rank = static_cast<int>(me - ranks.begin());
  return description.make_group({store, ranks, rank, rank_, timeout});
}

}  // namespace dtensor
