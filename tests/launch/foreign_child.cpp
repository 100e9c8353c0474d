// The launcher waits for its ranks, not for other children of the process: a program that started a
// child of its own before calling run_local_ranks must still see every rank finish (before the fix, the
// foreign child's exit counted as a rank's and indexed past the launcher's list of ranks).

#include <dtensor/launch.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  const std::string dir = std::getenv("MARKER_DIR") ? std::getenv("MARKER_DIR") : "/tmp";
  if (!dtensor::started_as_rank() && fork() == 0) _exit(0);  // the foreign child, gone at once
  const int rc = dtensor::run_local_ranks(argc, argv, {.nprocs = 2}, [&](const std::shared_ptr<dtensor::World>& world) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::ofstream(dir + "/rank_" + std::to_string(world->rank())) << "done";
    return 0;
  });
  if (dtensor::started_as_rank()) return rc;
  // The launcher: both ranks must have finished their work before it returned.
  for (int r = 0; r < 2; ++r)
    if (!std::ifstream(dir + "/rank_" + std::to_string(r))) {
      std::printf("rank %d had not finished when the launcher returned\n", r);
      return 1;
    }
  if (rc != 0) {
    std::printf("FAIL: a rank exited with %d\n", rc);
    return rc;
  }
  std::printf("PASS: the launcher waited for both ranks\n");
  return 0;
}
