#include "dtensor/world.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <c10/util/Logging.h>

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
#include "error_text.h"
#include "peer_watch.h"
#include "store_connections.h"

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
    double seconds = 0;
    try {
      seconds = std::stod(*v);
    } catch (const std::exception&) {
      throw DTensorError("DTENSOR_TIMEOUT_S='" + *v + "' is not a number of seconds");
    }
    // Below a millisecond every wait would time out at once (and zero means no limit to some of c10d).
    if (!(seconds >= 0.001) || seconds > 1e9) throw DTensorError("DTENSOR_TIMEOUT_S='" + *v + "': give a time limit from 0.001 to 1e9 seconds");
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  return fallback;
}

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
  // So that a peer's failed collective can say which process on which host went away or went quiet.
  const std::string me = detail::PeerWatch::process_entry();
  store_->set(detail::PeerWatch::process_key(rank), std::vector<uint8_t>(me.begin(), me.end()));
  // A peer is silent after a few beats: well inside the timeout, so a timed-out collective can name it.
  const auto beat = std::clamp(timeout_ / 10, std::chrono::milliseconds(100), std::chrono::milliseconds(1000));
  std::function<void()> abandon_store;
  c10::intrusive_ptr<c10d::Store> underlying = store_;
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(underlying.get())) underlying = prefixed->getUnderlyingNonPrefixStore();
  if (const auto* tcp = dynamic_cast<const c10d::TCPStore*>(underlying.get()))
    abandon_store = [connections = std::make_shared<detail::StoreConnections>(tcp->getHost(), tcp->getPort())] {
      // c10d logs each call that fails on a closed socket as a warning with C++ stack frames; this rank
      // is about to report the fault itself, in dtensor's words, so from here on only errors are logged.
      FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 2);
      connections->shut_down();
    };
  watch_ = std::make_unique<detail::PeerWatch>(store_->clone(), rank, size, beat, timeout_, std::move(abandon_store));
}

std::string World::describe_peers(const std::vector<int64_t>& ranks, bool settle) const {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  if (!watch_) return "";
  return settle ? watch_->describe_after_settling(ranks) : watch_->describe(ranks);
}

World::~World() { shutdown(); }

c10::intrusive_ptr<c10d::Store> World::store(const std::string& channel) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!store_) throw DTensorError("rank " + std::to_string(rank_) + ": the world was shut down; it has no store");
  if (channel.empty()) return store_;
  auto& connection = channel_stores_[channel];
  if (!connection) connection = store_->clone();
  return connection;
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
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    watch_.reset();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  channel_stores_.clear();
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
    c10::intrusive_ptr<c10d::Store> store = tcp_store(rank, size, agent_store, timeout);
    // torchrun's elastic restarts meet again in the same store: each attempt's keys stay apart (as
    // PyTorch's own process-group setup does), or a restarted job would read the last attempt's groups.
    if (const auto attempt = env("TORCHELASTIC_RESTART_COUNT"))
      store = c10::make_intrusive<c10d::PrefixStore>("dtensor/attempt-" + *attempt, store);
    world = std::make_shared<World>(store, rank, size, options);
    launcher = env("DTENSOR_LAUNCHED") ? "dtensor" : "torchrun";
  } else if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    const int rank = env_int("OMPI_COMM_WORLD_RANK"), size = env_int("OMPI_COMM_WORLD_SIZE");
    c10::intrusive_ptr<c10d::Store> store;
    if (env("MASTER_ADDR") && env("MASTER_PORT")) {
      // dtensor's launcher, when it starts the ranks through mpirun, holds the store itself.
      const bool launcher_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
      store = tcp_store(rank, size, launcher_store, timeout);
    } else {
      // One mpirun job = one id; all its ranks share this machine's /tmp when run locally. Ranks on
      // several hosts have no shared /tmp: they must meet over TCP.
      if (env("OMPI_COMM_WORLD_LOCAL_SIZE") && env_int("OMPI_COMM_WORLD_LOCAL_SIZE") != size)
        throw DTensorError("mpirun started " + std::to_string(size) + " ranks on several hosts (" +
                           *env("OMPI_COMM_WORLD_LOCAL_SIZE") + " on this one): set MASTER_ADDR (a host every rank "
                           "reaches, where rank 0 runs) and MASTER_PORT, and pass them with mpirun -x, so the ranks "
                           "can meet over TCP");
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

int64_t World::sum_across_ranks(int64_t value, const std::string& channel, std::chrono::milliseconds patience) {
  int64_t total = 0;
  for (const std::string& each : gather_across_ranks(std::to_string(value), channel, patience)) total += std::stoll(each);
  return total;
}

void World::wait_for_agreement(c10d::Store& store, const std::string& key, int peer, std::chrono::steady_clock::time_point deadline,
                               std::chrono::milliseconds patience) const {
  using Clock = std::chrono::steady_clock;
  while (true) {
    const auto slice = std::max(std::min(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()), timeout_),
                                std::chrono::milliseconds(1));
    const Clock::time_point start = Clock::now();
    try {
      store.wait({key}, slice);
      return;
    } catch (const std::exception& e) {
      // A wait that ran its whole slice: a peer that still beats is working (on a verdict's oracle, say)
      // and is given the rest of the patience. One that exited or fell silent is named now, and so is a
      // wait that failed early (the store's connection lost), as without patience.
      const bool ran_out = Clock::now() - start >= slice * 9 / 10;  // a store's clock may end it a little early
      const std::string peers = describe_peers({peer}, /*settle=*/false);
      if (ran_out && peers.empty() && Clock::now() < deadline) continue;
      const std::string waited = patience > timeout_ ? "the patience given (" + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(patience).count()) + " s)" : "the world's timeout";
      throw DTensorError("rank " + std::to_string(rank_) + ": agreeing through the store: rank " + std::to_string(peer) + " did not report" +
                         (peers.empty() ? " within " + waited : ": " + peers) + " (" + detail::without_source_locations(e) + ")");
    }
  }
}

std::vector<std::string> World::gather_across_ranks(const std::string& value, const std::string& channel, std::chrono::milliseconds patience) {
  const auto store = this->store(channel);
  int64_t serial = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    serial = agreements_done_[channel]++;
  }
  const std::string prefix = "dtensor/gather/" + (channel.empty() ? "" : channel + "/") + std::to_string(serial) + "/";
  store->set(prefix + std::to_string(rank_), std::vector<uint8_t>(value.begin(), value.end()));
  std::vector<std::string> out;
  const auto deadline = std::chrono::steady_clock::now() + std::max(patience, timeout_);  // for the whole agreement
  for (int r = 0; r < size_; ++r) {
    const std::string key = prefix + std::to_string(r);
    wait_for_agreement(*store, key, r, deadline, patience);
    const auto bytes = store->get(key);
    out.emplace_back(bytes.begin(), bytes.end());
  }
  // Rank 0 may host the store: it leaves only once every rank has read, or a job's last agreement
  // (its verdict) would have the others' reads reset by a server that exited.
  if (store->add(prefix + "read", 1) == size_) store->set(prefix + "all_read", std::vector<uint8_t>{1});
  if (rank_ == 0) {
    try {
      store->wait({prefix + "all_read"}, timeout_);
    } catch (const std::exception& e) {
      throw DTensorError("rank 0: agreeing through the store: not every rank read the others' values within the world's timeout (" +
                         detail::without_source_locations(e) + ")");
    }
  }
  return out;
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
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
  const auto start = std::chrono::steady_clock::now();
  try {
    auto group = description.make_group({store, ranks, rank, rank_, timeout});
    // Every member joined the world before this group could form: learn where each runs now, while the
    // store answers, for the errors a later fault may raise.
    std::lock_guard<std::mutex> lock(watch_mutex_);
    if (watch_) watch_->learn_processes(*store_, ranks);
    return group;
  } catch (const DTensorError&) {
    throw;
  } catch (const std::exception& e) {
    // Typically a peer that never published its address in the store: say which, and where it runs.
    std::string members;
    for (auto r : ranks) members += (members.empty() ? "" : ", ") + std::to_string(r);
    const std::string peers = describe_peers(ranks, /*settle=*/false);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    throw DTensorError("rank " + std::to_string(rank_) + ": creating the " + to_string(description.backend) +
                       " process group of ranks [" + members + "] failed after " + std::to_string(took).substr(0, 5) +
                       " s" + (peers.empty() ? "" : ": peers not answering: " + peers) + " (" +
                       detail::without_source_locations(e) + ")");
  }
}

}  // namespace dtensor
