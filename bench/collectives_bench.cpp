// Collective bandwidth on this host: the MPI backend against Gloo over the same ranks (two meshes in
// one job, started through mpirun), and against memcpy of the same bytes by one process. Rank 0 prints
// markdown rows; bench/collectives.sh (./dev bench collectives) runs 2 and 4 ranks.
//
//   dtensor_collectives_bench [--ranks N] [--max-mib M] [--seconds S]
//
// Bandwidth is the whole tensor's bytes over the time (nccl-tests' "algorithm bandwidth"): the output
// of an all-gather, the tensor of an all-reduce, the input of a reduce-scatter or all-to-all. A time
// is the maximum over ranks of one call, from a barrier, the median over repetitions.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dtensor/dtensor.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int ranks = 2;
  int64_t max_mib = 256;
  double seconds = 0.5;  // per measurement, at least 3 repetitions
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + flag);
    if (flag == "--ranks") args.ranks = std::stoi(argv[i + 1]);
    else if (flag == "--max-mib") args.max_mib = std::stoll(argv[i + 1]);
    else if (flag == "--seconds") args.seconds = std::stod(argv[i + 1]);
    else throw std::invalid_argument("unknown flag " + flag + " (use --ranks, --max-mib, --seconds)");
  }
  return args;
}

// The buffers of one operation at one size, and how to run it once on a backend.
struct Operation {
  std::string name;
  std::function<void(c10d::Backend&)> run;
};

Operation make_operation(const std::string& name, int64_t bytes, int64_t ranks) {
  const int64_t n = bytes / 4;  // float32 elements of the whole tensor
  const auto floats = at::TensorOptions().dtype(at::kFloat);
  if (name == "all-gather") {
    auto in = at::ones({n / ranks}, floats), out = at::empty({n}, floats);
    return {name, [in, out](c10d::Backend& g) mutable { g.all_gather_single(out, in)->wait(); }};
  }
  if (name == "all-reduce") {
    std::vector<at::Tensor> t{at::ones({n}, floats)};
    return {name, [t](c10d::Backend& g) mutable { g.allreduce(t)->wait(); }};
  }
  if (name == "reduce-scatter") {
    auto in = at::ones({n}, floats), out = at::empty({n / ranks}, floats);
    return {name, [in, out](c10d::Backend& g) mutable { g.reduce_scatter_single(out, in)->wait(); }};
  }
  auto in = at::ones({n}, floats), out = at::empty({n}, floats);
  return {name, [in, out](c10d::Backend& g) mutable {
            std::vector<int64_t> equal;
            g.all_to_all_single(out, in, equal, equal)->wait();
          }};
}

class Timer {
 public:
  Timer(dtensor::MeshPtr sync, const Args& args) : sync_(std::move(sync)), args_(args) {}

  // Median over repetitions of the slowest rank's time for one call of `f`, in seconds.
  double median_seconds(const std::function<void()>& f) {
    f();  // warm-up: first touch of the buffers, connections
    // Every rank must run the same number of repetitions, so the decision uses the agreed times only.
    std::vector<double> times;
    double total = 0;
    while (times.size() < 3 || (times.size() < 50 && total < args_.seconds)) {
      barrier();
      const auto t0 = Clock::now();
      f();
      times.push_back(slowest(seconds_since(t0)));
      total += times.back();
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    return times[times.size() / 2];
  }

 private:
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
  void barrier() { sync_->group(0)->barrier()->wait(); }
  double slowest(double s) {
    std::vector<at::Tensor> t{at::full({1}, s, at::kDouble)};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    sync_->group(0)->allreduce(t, max)->wait();
    return t[0].item<double>();
  }

  dtensor::MeshPtr sync_;
  const Args& args_;
};

// memcpy of `bytes` by rank 0 alone while the others sleep in a store wait (not polling, so the copy
// has the machine): the one-process bandwidth a collective on this host is measured against.
double memcpy_seconds(const std::shared_ptr<dtensor::World>& world, int64_t bytes, const Args& args, int serial) {
  const std::string key = "bench/memcpy/" + std::to_string(serial);
  double result = 0;
  if (world->rank() == 0) {
    at::Tensor src = at::ones({bytes}, at::kByte), dst = at::empty({bytes}, at::kByte);
    dst.copy_(src);
    std::vector<double> times;
    const auto start = Clock::now();
    while (times.size() < 3 || (times.size() < 50 && std::chrono::duration<double>(Clock::now() - start).count() < args.seconds)) {
      const auto t0 = Clock::now();
      dst.copy_(src);
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    result = times[times.size() / 2];
    const std::string text = std::to_string(result);
    world->store()->set(key, std::vector<uint8_t>(text.begin(), text.end()));
  } else {
    world->store()->wait({key});
    const auto v = world->store()->get(key);
    result = std::stod(std::string(v.begin(), v.end()));
  }
  return result;
}

int run(const std::shared_ptr<dtensor::World>& world, const Args& args) {
  at::set_num_threads(1);
  using dtensor::CommBackend;
  const auto gloo = dtensor::DeviceMesh::create(world, {world->size()}, {.backend = CommBackend::Gloo});
  const auto mpi = dtensor::DeviceMesh::create(world, {world->size()}, {.backend = CommBackend::Mpi});
  Timer timer(mpi, args);
  if (world->rank() == 0) {
    std::printf(
        "| operation | ranks | MiB | Gloo GB/s | MPI GB/s | memcpy, 1 process GB/s | memcpy, every rank GB/s | MPI / Gloo | "
        "MPI / memcpy 1 process | MPI / memcpy every rank |\n");
    std::printf("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  }
  int serial = 0;
  for (const std::string name : {"all-gather", "all-reduce", "reduce-scatter", "all-to-all"}) {
    for (int64_t mib = 1; mib <= args.max_mib; mib *= 4) {
      const int64_t bytes = mib << 20;
      Operation op = make_operation(name, bytes, world->size());
      // Which backend goes first alternates, so neither always meets a warmer cache.
      double gloo_s = 0, mpi_s = 0;
      const bool gloo_first = (serial % 2) == 0;
      for (int turn = 0; turn < 2; ++turn) {
        const bool on_gloo = (turn == 0) == gloo_first;
        auto group = (on_gloo ? gloo : mpi)->group(0);
        (on_gloo ? gloo_s : mpi_s) = timer.median_seconds([&] { op.run(*group); });
      }
      const double copy_s = memcpy_seconds(world, bytes, args, serial++);
      // Every rank copying at once: what an all-gather, which has every rank write the whole tensor,
      // could at best reach when the ranks share the memory bandwidth.
      at::Tensor src = at::ones({bytes}, at::kByte), dst = at::empty({bytes}, at::kByte);
      const double all_copy_s = timer.median_seconds([&] { dst.copy_(src); });
      if (world->rank() == 0) {
        const double gb = static_cast<double>(bytes) / 1e9;
        std::printf("| %s | %d | %lld | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", name.c_str(), world->size(),
                    static_cast<long long>(mib), gb / gloo_s, gb / mpi_s, gb / copy_s, gb / all_copy_s, gloo_s / mpi_s,
                    copy_s / mpi_s, all_copy_s / mpi_s);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  if (!dtensor::mpi_built_in()) {
    std::fprintf(stderr, "dtensor was built without MPI: nothing to compare Gloo with\n");
    return 1;
  }
  return dtensor::run_local_ranks(argc, argv, {.nprocs = args.ranks, .via = dtensor::LaunchVia::Mpirun},
                                  [&](const std::shared_ptr<dtensor::World>& world) { return run(world, args); });
}
