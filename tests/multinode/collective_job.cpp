// The target of the multi-node fault tests: a job that joins the world, optionally waits for the test
// to inject a fault (DTENSOR_TEST_HOLD_DIR: it writes joined-<rank> there and waits for a file named
// go), then builds a 1-d mesh over every rank and runs DTensor matmuls (an all-reduce and an
// all-gather each) for DTENSOR_TEST_SECONDS, checking each result against the full tensors. Prints
// "running" once training has begun and "done" when it ends; an error ends the rank with its message.

#include <ATen/ATen.h>
#include <dtensor/dtensor.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace {

void hold_until_go(const std::filesystem::path& dir, int rank) {
  std::ofstream(dir / ("joined-" + std::to_string(rank))) << "joined\n";
  while (!std::filesystem::exists(dir / "go")) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

int main(int argc, char** argv) {
  return dtensor::run_local_ranks(argc, argv, {}, [](const std::shared_ptr<dtensor::World>& world) {
    if (const char* dir = std::getenv("DTENSOR_TEST_HOLD_DIR")) hold_until_go(dir, world->rank());
    auto mesh = dtensor::DeviceMesh::create(world, {world->size()}, {.dim_names = {"tp"}});
    const double seconds = std::atof(std::getenv("DTENSOR_TEST_SECONDS") ? std::getenv("DTENSOR_TEST_SECONDS") : "2");
    at::manual_seed(0);
    const at::Tensor a = at::randn({37, 64}), b = at::randn({64, 29});
    const at::Tensor expected = at::matmul(a, b);
    const at::Tensor da = dtensor::distribute_tensor(a, mesh, dtensor::Placements{dtensor::Shard(1)});
    const at::Tensor db = dtensor::distribute_tensor(b, mesh, dtensor::Placements{dtensor::Shard(0)});
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    bool announced = false;
    while (std::chrono::steady_clock::now() < end) {
      const at::Tensor got = dtensor::full_tensor(at::matmul(da, db));
      if (!at::allclose(got, expected, 1e-4, 1e-5)) {
        std::printf("rank %d: WRONG result\n", world->rank());
        return 1;
      }
      if (!announced) std::printf("rank %d: running\n", world->rank()), std::fflush(stdout), announced = true;
    }
    std::printf("rank %d: done\n", world->rank());
    return 0;
  });
}
