// Redistribute throughput next to the raw c10d collective that moves the same bytes, timed in the
// same run, plus the host-side planning time per redistribute call. Rank 0 prints markdown tables.
// bench/run.sh (./dev bench) runs it for 2 and 4 ranks and writes bench/results/redistribute.md.
//
//   dtensor_redistribute_bench [--ranks N] [--sizes-mib 1,4,16,64,256] [--seconds S] [--only S(0)->S(1)]
//
// --sizes-mib: each rank's local input in MiB; --seconds: time budget per transition and size;
// --only: time just this transition (for profiling one path).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/api.h"
#include "dtensor/device_mesh.h"
#include "dtensor/launch.h"
#include "dtensor/world.h"

namespace {

using dtensor::Placement;
using dtensor::Shape;
using Clock = std::chrono::steady_clock;

// float32 rows of 4 KiB: with a rank count dividing 256, every size in whole MiB splits evenly along
// either dim, so these are the even layouts with no padding (and the raw collectives need no counts).
constexpr int64_t kColumns = 1024;
constexpr int64_t kRowsPerMiB = (int64_t{1} << 20) / (kColumns * 4);
constexpr int kMinIters = 5;  // enough for a median even where one call takes over a second
constexpr int kMaxIters = 200;
constexpr double kPlanningSeconds = 0.2;

struct Options {
  int ranks = 2;
  std::vector<int64_t> sizes_mib{1, 4, 16, 64, 256};
  double seconds = 1.0;
  std::string only;  // empty: every transition
};

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) values.push_back(std::stoll(item));
  return values;
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + flag);
    const std::string value = argv[++i];
    if (flag == "--ranks") options.ranks = std::stoi(value);
    else if (flag == "--sizes-mib") options.sizes_mib = parse_list(value);
    else if (flag == "--seconds") options.seconds = std::stod(value);
    else if (flag == "--only") options.only = value;
    else throw std::invalid_argument("unknown flag " + flag + " (use --ranks, --sizes-mib, --seconds, --only)");
  }
  if (options.ranks < 1 || kRowsPerMiB % options.ranks != 0)
    throw std::invalid_argument("--ranks must divide " + std::to_string(kRowsPerMiB) + " so that shards are even");
  return options;
}

std::string fmt(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

// One transition and the c10d call a hand-written program would make instead.
struct Case {
  std::string name;
  Placement src, dst;
  std::string baseline;
  // Runs the baseline on this rank's input. It allocates its output as the DTensor path must (that
  // returns a new tensor); the all-reduce works in place, as a hand-written one would.
  std::function<void(c10d::Backend&, at::Tensor&)> raw;
  // Moves the DTensor into redistribute (donating its buffer) instead of passing a reference.
  bool donate = false;
};

void allreduce_in_place(c10d::Backend& g, at::Tensor& in) {
  std::vector<at::Tensor> tensors{in};
  g.allreduce(tensors)->wait();
}

std::vector<Case> make_cases() {
  using dtensor::Partial;
  using dtensor::Replicate;
  using dtensor::Shard;
  return {
      {"S(0)->R", Shard(0), Replicate(), "all_gather_single",
       [](c10d::Backend& g, at::Tensor& in) {
         at::Tensor out = at::empty({in.size(0) * g.getSize(), in.size(1)}, in.options());
         g.all_gather_single(out, in)->wait();
       }},
      {"P->R", Partial(), Replicate(), "allreduce (in place)", allreduce_in_place},
      {"P->R (donated)", Partial(), Replicate(), "allreduce (in place)", allreduce_in_place, /*donate=*/true},
      {"P->S(0)", Partial(), Shard(0), "reduce_scatter_single",
       [](c10d::Backend& g, at::Tensor& in) {
         at::Tensor out = at::empty({in.size(0) / g.getSize(), in.size(1)}, in.options());
         g.reduce_scatter_single(out, in)->wait();
       }},
      // The same bytes, but row blocks rather than the column blocks S(1) needs: a lower bound.
      {"S(0)->S(1)", Shard(0), Shard(1), "all_to_all_single",
       [](c10d::Backend& g, at::Tensor& in) {
         at::Tensor out = at::empty_like(in);
         std::vector<int64_t> equal_splits;  // empty: every member gets the same count
         g.all_to_all_single(out, in, equal_splits, equal_splits)->wait();
       }},
      // What a hand-written program must run: c10d takes one contiguous send buffer, so the column
      // block for each member is packed into it first.
      {"S(0)->S(1)", Shard(0), Shard(1), "pack + all_to_all_single",
       [](c10d::Backend& g, at::Tensor& in) {
         const int64_t n = g.getSize();
         at::Tensor send = in.view({in.size(0), n, in.size(1) / n}).transpose(0, 1).contiguous();
         at::Tensor out = at::empty({in.size(0) * n, in.size(1) / n}, in.options());
         std::vector<int64_t> equal_splits;
         g.all_to_all_single(out, send, equal_splits, equal_splits)->wait();
       }},
  };
}

void barrier(c10d::Backend& g) {
  std::vector<at::Tensor> token{at::zeros({1})};
  g.allreduce(token)->wait();
}

// Every rank must run the same number of iterations, so they agree on the slowest rank's estimate.
double max_over_ranks(c10d::Backend& g, double value) {
  std::vector<at::Tensor> t{at::full({1}, value, at::kDouble)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  g.allreduce(t, options)->wait();
  return t[0].item<double>();
}

// Seconds `op` takes on this rank, all ranks starting together.
template <typename Op>
double timed(c10d::Backend& g, Op&& op) {
  barrier(g);
  const auto start = Clock::now();
  op();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Median and best of one side's per-call seconds. Other load on the machine only ever adds time, so
// the best calls show the intrinsic cost when the medians are disturbed.
struct Summary {
  double median, best;
};

Summary summarize(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  return {n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2, seconds.front()};
}

struct Timing {
  Summary raw, dtensor;
  int iters;
};

at::Tensor make_dtensor(const at::Tensor& local, const dtensor::MeshPtr& mesh, const Placement& src) {
  const Shape global = dtensor::global_shape_assuming_even(local.sizes().vec(), mesh->shape(), {src});
  return dtensor::from_local(local, mesh, {src},
                             {.run_check = false, .shape = global, .stride = dtensor::contiguous_strides(global)});
}

// One DTensor redistribute of `dt`. A donating case moves `dt` in, then wraps the result's buffer with
// the source placements as the next call's input, as a loop that keeps donating one buffer would (the
// wrapping, a few microseconds, is timed with the call).
void run_redistribute(const Case& c, at::Tensor& dt) {
  const dtensor::Placements dst{c.dst};
  if (!c.donate) {
    at::Tensor out = dtensor::redistribute(dt, dst);
    return;
  }
  at::Tensor out = dtensor::redistribute(std::move(dt), dst);
  dt = make_dtensor(dtensor::to_local(out), dtensor::mesh_of(out), c.src);
}

// Interleaves DTensor and raw calls (alternating which goes first) so both see the same machine
// load; the other processes on a shared machine shift both medians alike.
Timing measure(c10d::Backend& g, const Case& c, at::Tensor& dt, at::Tensor& local, double budget) {
  auto run_dtensor = [&] { run_redistribute(c, dt); };
  auto run_raw = [&] { c.raw(g, local); };
  double round = 0;
  for (int i = 0; i < 2; ++i)  // the first round pays for first-touch page faults
    round = timed(g, run_dtensor) + timed(g, run_raw);
  const int iters = std::clamp(static_cast<int>(budget / max_over_ranks(g, round)), kMinIters, kMaxIters);
  std::vector<double> raw, dtensor_times;
  for (int i = 0; i < iters; ++i) {
    if (i % 2) raw.push_back(timed(g, run_raw));
    dtensor_times.push_back(timed(g, run_dtensor));
    if (i % 2 == 0) raw.push_back(timed(g, run_raw));
  }
  return {summarize(raw), summarize(dtensor_times), iters};
}

// This rank's input: zeros, so repeated in-place all-reduces cannot overflow (the values do not
// change Gloo's speed).
at::Tensor make_input(int64_t mib) { return at::zeros({mib * kRowsPerMiB, kColumns}); }

void print_throughput_header(int ranks) {
  std::printf("### Throughput (%d ranks)\n\n", ranks);
  std::printf("| transition | c10d baseline | MiB/rank | iters | raw ms | DTensor ms | raw GiB/s | DTensor GiB/s "
              "| ratio | ratio of best |\n");
  std::printf("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
}

void print_throughput_row(const Case& c, int64_t mib, const Timing& t) {
  const double gib = static_cast<double>(mib) / 1024;
  const double ratio = t.raw.median / t.dtensor.median;
  // Bold marks a ratio under the 0.95 goal.
  std::printf("| %s | %s | %lld | %d | %s | %s | %s | %s | %s | %s |\n", c.name.c_str(), c.baseline.c_str(),
              static_cast<long long>(mib), t.iters, fmt("%.2f", t.raw.median * 1e3).c_str(),
              fmt("%.2f", t.dtensor.median * 1e3).c_str(), fmt("%.2f", gib / t.raw.median).c_str(),
              fmt("%.2f", gib / t.dtensor.median).c_str(), fmt(ratio < 0.95 ? "**%.3f**" : "%.3f", ratio).c_str(),
              fmt("%.3f", t.raw.best / t.dtensor.best).c_str());
  std::fflush(stdout);
}

void run_throughput(c10d::Backend& g, const dtensor::MeshPtr& mesh, const Options& options, bool print) {
  if (print) print_throughput_header(options.ranks);
  for (const Case& c : make_cases()) {
    if (!options.only.empty() && c.name != options.only) continue;
    for (int64_t mib : options.sizes_mib) {
      at::Tensor local = make_input(mib);
      // A donated buffer must have no other holder, so that DTensor gets an input of its own.
      at::Tensor dt = make_dtensor(c.donate ? make_input(mib) : local, mesh, c.src);
      const Timing t = measure(g, c, dt, local, options.seconds);
      if (print) print_throughput_row(c, mib, t);
    }
  }
}

// Mean microseconds per call over batches of calls run for kPlanningSeconds.
template <typename Call>
double micros_per_call(Call&& call) {
  constexpr int kBatch = 1000;
  int64_t calls = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (elapsed < kPlanningSeconds) {
    for (int i = 0; i < kBatch; ++i) call();
    calls += kBatch;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return elapsed * 1e6 / static_cast<double>(calls);
}

// Host-only, so rank 0 alone runs it while the others wait: no rank competes for the cores.
void print_planning(const dtensor::MeshPtr& mesh, int ranks) {
  std::printf("\n### Host-side planning per redistribute call (%d ranks)\n\n", ranks);
  std::printf("| transition | plan | plan_redistribute µs | redistribute_plan (cached) µs |\n");
  std::printf("|---|---|--:|--:|\n");
  std::vector<std::pair<Placement, Placement>> planned;  // one row per transition, however many baselines
  for (const Case& c : make_cases()) {
    if (std::find(planned.begin(), planned.end(), std::pair{c.src, c.dst}) != planned.end()) continue;
    planned.emplace_back(c.src, c.dst);
    at::Tensor dt = make_dtensor(make_input(1), mesh, c.src);
    const Shape global = dt.sizes().vec();
    const dtensor::Placements src{c.src}, dst{c.dst};
    const double pure = micros_per_call(
        [&] { dtensor::plan_redistribute(global, dt.element_size(), mesh->shape(), *mesh->coordinate(), src, dst); });
    const double cached = micros_per_call([&] { dtensor::redistribute_plan(dt, dst); });
    std::printf("| %s | %s | %s | %s |\n", c.name.c_str(), dtensor::redistribute_plan(dt, dst).str().c_str(),
                fmt("%.2f", pure).c_str(), fmt("%.2f", cached).c_str());
  }
  std::printf("\n");
}

int bench(const std::shared_ptr<dtensor::World>& world, const Options& options) {
  // One intra-op thread per rank, as torchrun sets for multi-process jobs: ranks sharing the cores
  // would otherwise oversubscribe them in the executor's copies.
  if (!std::getenv("OMP_NUM_THREADS")) at::set_num_threads(1);
  const auto mesh = dtensor::DeviceMesh::create(world, {options.ranks});
  auto group = mesh->group(0);
  const bool rank0 = world->rank() == 0;
  if (rank0)
    std::printf("LibTorch %s, %s backend (ranks started by %s), 1-d mesh of %d ranks, %d intra-op thread(s) per rank.\n\n",
                DTENSOR_BENCH_TORCH_VERSION, dtensor::to_string(mesh->backend()).c_str(), world->launcher().c_str(),
                options.ranks, at::get_num_threads());
  run_throughput(*group, mesh, options, rank0);
  if (rank0) print_planning(mesh, options.ranks);
  barrier(*group);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtensor_redistribute_bench: %s\n", e.what());
    return 2;
  }
  dtensor::LaunchOptions launch;
  launch.nprocs = options.ranks;
  return dtensor::run_local_ranks(argc, argv, launch,
                                  [&](const std::shared_ptr<dtensor::World>& world) { return bench(world, options); });
}
