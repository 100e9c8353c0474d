// Host overhead dtensor adds to an op: the same op on a DTensor and on its local tensor, in the same
// process, on a one-rank mesh (so no communication is involved). Cache-hit calls are timed in
// batches; the cache-miss (first call) cost is timed by clearing the propagation cache before each call.
//   dtensor_dispatch_bench [--iterations N]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dtensor/comm_debug.h"
#include "dtensor/dtensor.h"
#include "dtensor/sharding.h"

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {

// Median over batches of the mean microseconds per call.
double micros_per_call(const std::function<void()>& call, int iterations) {
  std::vector<double> batches;
  for (int b = 0; b < 15; ++b) {
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) call();
    batches.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iterations);
  }
  std::sort(batches.begin(), batches.end());
  return batches[batches.size() / 2];
}

double median_first_call_micros(const std::function<void()>& call) {
  std::vector<double> samples;
  for (int i = 0; i < 50; ++i) {
    clear_propagation_cache();
    const auto start = Clock::now();
    call();
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

struct Case {
  std::string op;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> run;
};

void measure(const MeshPtr& mesh, int64_t n, int iterations) {
  const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
  const at::Tensor da = distribute_tensor(a, mesh, Placements{Shard(0)});
  const at::Tensor db = distribute_tensor(b, mesh, Placements{Replicate()});
  const at::Tensor la = local_tensor_of(da), lb = local_tensor_of(db);
  const std::vector<Case> cases = {
      {"add", [](const at::Tensor& x, const at::Tensor& y) { return at::add(x, y); }},
      {"mm", [](const at::Tensor& x, const at::Tensor& y) { return at::mm(x, y); }},
      {"relu", [](const at::Tensor& x, const at::Tensor&) { return at::relu(x); }},
  };
  for (const auto& c : cases) {
    const int iters = n >= 512 && c.op == "mm" ? std::max(1, iterations / 200) : iterations;
    const double local = micros_per_call([&] { c.run(la, lb); }, iters);
    const double dist = micros_per_call([&] { c.run(da, db); }, iters);
    const double first = median_first_call_micros([&] { c.run(da, db); });
    std::printf("| %s | %lldx%lld | %.2f | %.2f | **%.2f** | %.1f | **%.1f** |\n", c.op.c_str(), static_cast<long long>(n),
                static_cast<long long>(n), local, dist, dist - local, first, first - local);
  }
}

// A training-like step with autograd: forward and backward of sum(relu(x @ w + b)) with w and b
// requiring gradients, on DTensors and on their local tensors. Per step and per DTensor op dispatched
// (forward and backward ops, counted with CommDebugMode).
void measure_autograd(const MeshPtr& mesh, int64_t n, int iterations) {
  const at::Tensor x = distribute_tensor(at::randn({n, n}), mesh, Placements{Shard(0)});
  const at::Tensor w = distribute_tensor(at::randn({n, n}), mesh, Placements{Replicate()}).requires_grad_();
  const at::Tensor b = distribute_tensor(at::randn({n}), mesh, Placements{Replicate()}).requires_grad_();
  const at::Tensor lx = local_tensor_of(x).clone(), lw = local_tensor_of(w).clone().requires_grad_(),
                   lb = local_tensor_of(b).clone().requires_grad_();
  auto step = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    at::relu(at::mm(x, w) + b).sum().backward();
    w.mutable_grad().reset();
    b.mutable_grad().reset();
  };
  int64_t ops = 0;
  {
    CommDebugMode debug;
    step(x, w, b);
    ops = static_cast<int64_t>(debug.ops().size());
  }
  const double local = micros_per_call([&] { step(lx, lw, lb); }, iterations);
  const double dist = micros_per_call([&] { step(x, w, b); }, iterations);
  std::printf("| %lldx%lld | %lld | %.2f | %.2f | **%.2f** | **%.2f** |\n", static_cast<long long>(n),
              static_cast<long long>(n), static_cast<long long>(ops), local, dist, dist - local, (dist - local) / ops);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2000;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::atoi(argv[i + 1]);
  LaunchOptions options;
  options.nprocs = 1;
  return run_local_ranks(argc, argv, options, [&](const std::shared_ptr<World>& world) {
    at::set_num_threads(1);
    auto mesh = DeviceMesh::create(world, {1});
    std::printf("| op | local shard | local op µs | DTensor op µs | added µs, cache hit | first call µs | added µs, cache miss |\n");
    std::printf("|---|---|--:|--:|--:|--:|--:|\n");
    for (int64_t n : {8, 512}) measure(mesh, n, iterations);
    std::printf("\nWith autograd: forward and backward of sum(relu(x @ w + b)), w and b requiring gradients.\n\n");
    std::printf("| local shards | DTensor ops per step | local step µs | DTensor step µs | added µs per step | added µs per op |\n");
    std::printf("|---|--:|--:|--:|--:|--:|\n");
    measure_autograd(mesh, 8, iterations / 4);
    return 0;
  });
}
