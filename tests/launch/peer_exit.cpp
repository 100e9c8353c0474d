// A rank whose process exits in the middle of a job: its peers' next collective fails at once with an
// error that names it and its host ("rank 2 on <host> (pid N) has exited"), not a claim of a time limit
// that never ran out, and no peer is killed by SIGPIPE on the way.

#include <ATen/ATen.h>
#include <dtensor/dtensor.h>

#include <unistd.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 3}, [](const std::shared_ptr<dtensor::World>& world) {
    auto mesh = dtensor::DeviceMesh::create(world, {3});
    at::Tensor x = dtensor::distribute_tensor(at::ones({6}), mesh, dtensor::Placements{dtensor::Shard(0)});
    if (world->rank() == 2) _exit(3);
    std::string error = "no error";
    try {
      dtensor::full_tensor(x);
    } catch (const std::exception& e) {
      error = e.what();
    }
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    const bool named = error.find("rank 2 on " + std::string(host) + " (pid ") != std::string::npos &&
                       error.find(") has exited") != std::string::npos;
    const bool no_timeout_claim = error.find("time limit") == std::string::npos;
    std::printf("%s rank %d: %s\n", named && no_timeout_claim ? "OK" : "WRONG", world->rank(), error.c_str());
    return 0;
  });
}
