#include "dtensor/launch.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "backend_environment.h"
#include "error_text.h"
#include "dtensor/errors.h"

#ifdef DTENSOR_WITH_MPI
#include "mpi/mpi_runtime.h"
#endif

extern char** environ;

namespace dtensor {
namespace {

bool has_env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// This process's environment without the variables a launcher sets, plus `extra`.
std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  static const std::vector<std::string> ours = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                                                "MASTER_ADDR=", "MASTER_PORT=", "TORCHELASTIC_USE_AGENT_STORE=",
                                                "DTENSOR_LAUNCHED="};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& prefix : ours) replaced |= entry.rfind(prefix, 0) == 0;
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Appends NAME=VALUE unless the user set NAME.
void set_default(std::vector<std::string>& env, const std::string& name, const std::string& value) {
  if (!has_env(name.c_str())) env.push_back(name + "=" + value);
}

// The launcher holds the store, like torchrun's agent: every rank connects as a client. glibc keeps
// freed blocks up to 1 GiB for reuse instead of returning each large one to the kernel: otherwise
// every tensor over 32 MiB is a fresh mapping whose pages fault in one by one, which made large
// collectives here 2-3x slower (bench/results/collectives.md). Set the variables to change it.
std::vector<std::string> store_variables(int port) {
  std::vector<std::string> env = {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                                  "TORCHELASTIC_USE_AGENT_STORE=True", "DTENSOR_LAUNCHED=1"};
  set_default(env, "MALLOC_MMAP_THRESHOLD_", "1073741824");
  set_default(env, "MALLOC_TRIM_THRESHOLD_", "1073741824");
  return env;
}

std::vector<std::string> rank_environment(int rank, int size, int port) {
  const std::string r = std::to_string(rank), n = std::to_string(size);
  auto extra = store_variables(port);
  for (const auto& kv : {"RANK=" + r, "LOCAL_RANK=" + r, "WORLD_SIZE=" + n, "LOCAL_WORLD_SIZE=" + n}) extra.push_back(kv);
  return environment_with(extra);
}

// mpirun's own settings for a job on this host, each only where the user has not set it: shared memory
// between the ranks (no network probing), no pinning (ranks may outnumber cores, and pinned ranks
// would then share one core while another idles), yielding while idle when they do outnumber cores,
// and running as root inside containers.
std::vector<std::string> mpirun_environment(int nprocs, int port) {
  auto extra = store_variables(port);
  set_default(extra, "OMPI_MCA_btl", "self,vader");
  set_default(extra, "OMPI_MCA_hwloc_base_binding_policy", "none");
  set_default(extra, "OMPI_MCA_rmaps_base_oversubscribe", "1");
  if (nprocs > static_cast<int>(std::thread::hardware_concurrency()))
    set_default(extra, "OMPI_MCA_mpi_yield_when_idle", "1");
  if (getuid() == 0) {
    set_default(extra, "OMPI_ALLOW_RUN_AS_ROOT", "1");
    set_default(extra, "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  return environment_with(extra);
}

std::string own_executable() {
  std::vector<char> path(4096);
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (n <= 0) throw std::runtime_error("dtensor launcher: cannot read /proc/self/exe");
  return std::string(path.data(), static_cast<size_t>(n));
}

pid_t start_process(const std::string& program, const std::vector<std::string>& args, std::vector<std::string> env) {
  std::vector<char*> envp, argp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> arguments = args;
  for (auto& a : arguments) argp.push_back(a.data());
  argp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("dtensor launcher: fork failed");
  if (pid == 0) {
    // A rank never outlives the launcher, so a killed launcher leaves no stray ranks behind.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    execve(program.c_str(), argp.data(), envp.data());
    _exit(127);
  }
  return pid;
}

bool use_mpirun(const LaunchOptions& options) {
  LaunchVia via = options.via;
  if (via == LaunchVia::Automatic) {
    const char* asked = std::getenv("DTENSOR_LAUNCHER");
    const std::string launcher = asked ? asked : "";
    if (launcher == "fork") via = LaunchVia::Fork;
    else if (launcher == "mpirun") via = LaunchVia::Mpirun;
    else if (!launcher.empty())
      throw DTensorError("DTENSOR_LAUNCHER='" + launcher + "' is not a launcher; use fork or mpirun");
  }
  if (via == LaunchVia::Fork) return false;
  if (via == LaunchVia::Mpirun && !mpi_built_in())
    throw DTensorError("the launcher was asked to use mpirun, but dtensor was built without MPI; use DTENSOR_LAUNCHER=fork");
  return via == LaunchVia::Mpirun || (mpi_built_in() && detail::backend_from_environment() != CommBackend::Gloo);
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped";
}

int launch(char** argv, const LaunchOptions& options) {
  c10d::TCPStoreOptions store_options;
  store_options.port = 0;  // any free port: no race with other jobs on this machine
  store_options.isServer = true;
  store_options.waitWorkers = false;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options);

  std::vector<std::string> own_args;
  for (char** a = argv; *a != nullptr; ++a) own_args.push_back(*a);
  const std::string self = own_executable();
  std::vector<pid_t> pids;
  std::vector<std::string> names;  // what each child is, for the messages
  if (use_mpirun(options)) {
#ifdef DTENSOR_WITH_MPI
    std::vector<std::string> args = {DTENSOR_MPIRUN, "-np", std::to_string(options.nprocs), self};
    args.insert(args.end(), own_args.begin() + 1, own_args.end());
    pids.push_back(start_process(DTENSOR_MPIRUN, args, mpirun_environment(options.nprocs, store->getPort())));
    names.push_back("mpirun (" + std::to_string(options.nprocs) + " ranks)");
#endif
  } else {
    for (int r = 0; r < options.nprocs; ++r) {
      pids.push_back(start_process(self, own_args, rank_environment(r, options.nprocs, store->getPort())));
      names.push_back("rank " + std::to_string(r));
    }
  }

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  std::optional<clock::time_point> kill_at;
  int result = 0, running = static_cast<int>(pids.size());
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      // A child this process started elsewhere (before or beside the launcher) is not a rank.
      const auto found = std::find(pids.begin(), pids.end(), pid);
      if (found == pids.end()) continue;
      --running;
      const auto child = static_cast<size_t>(found - pids.begin());
      *found = -1;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok) {
        std::cerr << "dtensor launcher: " << names[child] << " " << describe_exit(status) << std::endl;
        if (result == 0) {
          result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          kill_at = clock::now() + options.grace;
        }
      }
      continue;
    }
    const auto now = clock::now();
    const bool timed_out = options.timeout.count() > 0 && now - start > options.timeout;
    if (timed_out || (kill_at && now > *kill_at)) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] <= 0) continue;
        std::cerr << "dtensor launcher: killing " << names[r]
                  << (timed_out ? " (the job ran past its time limit)" : " (still running after another rank failed)")
                  << std::endl;
        kill(pids[r], SIGKILL);
      }
      if (result == 0) result = 124;
      kill_at.reset();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace

bool started_as_rank() {
  return (has_env("RANK") && has_env("WORLD_SIZE")) || (has_env("OMPI_COMM_WORLD_RANK") && has_env("OMPI_COMM_WORLD_SIZE"));
}

int run_local_ranks(int argc, char** argv, const LaunchOptions& options,
                    const std::function<int(const std::shared_ptr<World>&)>& body) {
  (void)argc;
  if (!started_as_rank()) {
    try {
      return launch(argv, options);
    } catch (const std::exception& e) {  // a bad DTENSOR_LAUNCHER or DTENSOR_BACKEND, a failed fork
      std::cerr << "dtensor launcher: " << e.what() << std::endl;
      return 2;
    }
  }
  int rank = -1;
  try {
    auto world = World::from_environment();
    rank = world->rank();
    return body(world);
  } catch (const std::exception& e) {
    // One write, so that ranks sharing a terminal do not interleave their lines.
    std::cerr << "rank " + std::to_string(rank) + ": " + detail::without_source_locations(e) + "\n" << std::flush;
#ifdef DTENSOR_WITH_MPI
    if (detail::mpi::initialized()) detail::mpi::abort_job(1);
#endif
    return 1;
  }
}

}  // namespace dtensor
