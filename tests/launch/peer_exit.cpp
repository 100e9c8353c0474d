// A rank whose process exits in the middle of a job: its peers' next collective, and a receive from it
// (a pipeline's next stage waiting for its activations), fail at once with an error that names it and
// its host ("rank 2 on <host> (pid N) has exited") and the receive's label, not a claim of a time limit
// that never ran out, and no peer is killed by SIGPIPE on the way.

#include <ATen/ATen.h>
#include <dtensor/dtensor.h>
#include <dtensor/p2p.h>

#include <unistd.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 3}, [](const std::shared_ptr<dtensor::World>& world) {
    auto mesh = dtensor::DeviceMesh::create(world, {3});
    auto pipeline = dtensor::DeviceMesh::create(world, {3}, {.dim_names = {"pp"}});  // groups of its own
    at::Tensor x = dtensor::distribute_tensor(at::ones({6}), mesh, dtensor::Placements{dtensor::Shard(0)});
    if (world->rank() == 2) _exit(3);
    auto error_of = [](const auto& run) {
      try {
        run();
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    const std::string collective = error_of([&] { dtensor::full_tensor(x); });
    const std::string transfer = error_of([&] { dtensor::recv(at::empty({4}), 2, pipeline, 0, "stage 2 -> " + std::to_string(world->rank())); });
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    auto names_the_dead_rank = [&](const std::string& error) {
      return error.find("rank 2 on " + std::string(host) + " (pid ") != std::string::npos && error.find(") has exited") != std::string::npos &&
             error.find("time limit") == std::string::npos;
    };
    const bool ok = names_the_dead_rank(collective) && names_the_dead_rank(transfer) &&
                    transfer.find("recv from coordinate 2 (rank 2) [stage 2 -> " + std::to_string(world->rank()) + "]") != std::string::npos;
    std::printf("%s rank %d: %s | %s\n", ok ? "OK" : "WRONG", world->rank(), collective.c_str(), transfer.c_str());
    return 0;
  });
}
