#include "dtensor/launch.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dtensor {
namespace {

bool has_env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

std::vector<std::string> child_environment(int rank, int size, int port) {
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
  const std::string r = std::to_string(rank), n = std::to_string(size);
  // The launcher holds the store, like torchrun's agent: every rank connects as a client.
  for (const auto& kv : {"RANK=" + r, "LOCAL_RANK=" + r, "WORLD_SIZE=" + n, "LOCAL_WORLD_SIZE=" + n,
                         std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port),
                         std::string("TORCHELASTIC_USE_AGENT_STORE=True"), std::string("DTENSOR_LAUNCHED=1")})
    env.push_back(kv);
  return env;
}

pid_t start_rank(char** argv, std::vector<std::string> env) {
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("dtensor launcher: fork failed");
  if (pid == 0) {
    // A rank never outlives the launcher, so a killed launcher leaves no stray ranks behind.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  return pid;
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

  std::vector<pid_t> pids;
  for (int r = 0; r < options.nprocs; ++r)
    pids.push_back(start_rank(argv, child_environment(r, options.nprocs, store->getPort())));

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  std::optional<clock::time_point> kill_at;
  int result = 0, running = options.nprocs;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      // A child this process started elsewhere (before or beside the launcher) is not a rank.
      const auto found = std::find(pids.begin(), pids.end(), pid);
      if (found == pids.end()) continue;
      --running;
      const auto rank = found - pids.begin();
      *found = -1;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok) {
        std::cerr << "dtensor launcher: rank " << rank << " " << describe_exit(status) << std::endl;
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
        std::cerr << "dtensor launcher: killing rank " << r
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
  if (!started_as_rank()) return launch(argv, options);
  int rank = -1;
  try {
    auto world = World::from_environment();
    rank = world->rank();
    return body(world);
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace dtensor
