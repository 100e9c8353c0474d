// What validating untrusted files costs: the same measurements built against two dtensor trees (this
// one and the one before the readers were hardened; bench/load_safety.sh builds both and alternates
// them). Uses only API both trees have.
//   load_safety_bench pt2 PATH [--rounds R]               load_program, then also reading every weight
//   load_safety_bench checkpoint DIR [--mb M] [--rounds R]  4 local ranks: M MiB saved Shard(0), loaded
//                                                           into Shard(1) (every rank reads rows of every file)
// Prints "name median_seconds" lines.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dtensor/checkpoint.h>
#include <dtensor/dtensor.h>
#include <dtensor/graph/program.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double seconds(F&& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int bench_pt2(const std::string& path, int rounds) {
  std::vector<double> load, load_and_read;
  for (int r = 0; r < rounds; ++r) {
    load.push_back(seconds([&] { dtensor::graph::load_program(path); }));
    load_and_read.push_back(seconds([&] {
      dtensor::graph::Program program = dtensor::graph::load_program(path);
      for (const auto& [name, state] : program.state) state.tensor();
    }));
  }
  std::printf("pt2_load %.6f\npt2_load_and_read_weights %.6f\n", median(load), median(load_and_read));
  return 0;
}

// 8 float tensors of [rows, 1024] making `mb` MiB in all, sharded `placement` over a 1-d mesh.
ckpt::State make_state(const dtensor::MeshPtr& mesh, dtensor::Placement placement, int64_t mb, bool zeros) {
  constexpr int64_t kTensors = 8, kCols = 1024;
  const int64_t rows = mb * (1 << 20) / 4 / kCols / kTensors;
  ckpt::State state;
  for (int64_t i = 0; i < kTensors; ++i) {
    at::Tensor whole = zeros ? at::zeros({rows, kCols}) : at::full({rows, kCols}, static_cast<double>(i));
    state["layer" + std::to_string(i) + ".weight"] = dtensor::distribute_tensor(whole, mesh, dtensor::Placements{placement});
  }
  return state;
}

int bench_checkpoint(int argc, char** argv, const std::string& dir, int64_t mb, int rounds) {
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 4}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);
    auto mesh = dtensor::DeviceMesh::create(world, {world->size()});
    if (world->rank() == 0) fs::remove_all(dir);
    world->sum_across_ranks(0);
    ckpt::save(make_state(mesh, dtensor::Shard(0), mb, false), dir);
    const ckpt::State target = make_state(mesh, dtensor::Shard(1), mb, true);
    std::vector<double> load, contents;
    for (int r = 0; r < rounds; ++r) {
      // From a start all ranks share until every rank is done: the mean over ranks.
      world->sum_across_ranks(0);
      const int64_t us = static_cast<int64_t>(1e6 * seconds([&] { ckpt::load(target, dir); }));
      world->sum_across_ranks(0);
      load.push_back(static_cast<double>(world->sum_across_ranks(us)) / world->size() / 1e6);
      if (world->rank() == 0) contents.push_back(seconds([&] { ckpt::contents(dir); }));
    }
    if (world->rank() == 0) {
      std::printf("checkpoint_load_other_layout %.6f\ncheckpoint_contents %.6f\n", median(load), median(contents));
      fs::remove_all(dir);
    }
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: load_safety_bench pt2 PATH [--rounds R] | checkpoint DIR [--mb M] [--rounds R]\n");
    return 2;
  }
  const std::string what = argv[1], path = argv[2];
  int rounds = 20;
  int64_t mb = 1024;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--rounds") rounds = std::stoi(argv[i + 1]);
    else if (flag == "--mb") mb = std::stoll(argv[i + 1]);
  }
  at::set_num_threads(1);
  if (what == "pt2") return bench_pt2(path, rounds);
  return bench_checkpoint(argc, argv, path, mb, rounds);
}
