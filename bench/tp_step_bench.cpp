// Training-step time of the GPT demo model (examples/gpt) under tensor parallelism: dtensor's plan
// (gpt::parallelize, local activations) next to a hand-written Megatron-style tensor parallelism of
// the same model over raw c10d all-reduces, in the same processes, alternating blocks of steps so
// that both see the same machine noise. With --tp 1, plain LibTorch (no dtensor) is the baseline.
// Rank 0 prints a markdown table; bench/tp_step.sh (./dev bench tp) runs TP = 1, 2, 4.
//
//   dtensor_tp_step_bench [--tp N] [--rounds R]
//   DTENSOR_BENCH_OP_COUNTS=1 also lists the DTensor ops one step dispatches, most frequent first.
//   DTENSOR_OP_CENSUS=1 prints, instead of timing, every op each implementation's step runs (on DTensors
//   and on plain tensors) with its count and inclusive time per step (bench/op_census.h).
//   DTENSOR_BENCH_SKIP_ALL_REDUCES=1 times the hand-written steps with their all-reduces skipped, once
//   the losses are checked (wrong values): per-rank compute alone, the bound on tensor parallelism's
//   tokens/s over the single process on this machine whatever the communication costs.
//   DTENSOR_BENCH_ONLY=dtensor|hand runs that implementation's steps alone after the warm-up (R x 5
//   steps, nothing printed), for a profiler: `perf record -- dtensor_tp_step_bench --tp 1 ...`.
//
// A timed step is forward, backward, AdamW step (dtensor::step_on_local_shards: optimizer.step() for
// plain parameters, over the local shards for DTensor ones), zero_grad, and reading the loss as a
// number (what a training loop logs; gpt::train_step without gradient clipping, which is benchmarked
// elsewhere).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "build_paths.h"
#include "flags.h"
#include "ratio_summary.h"
#include "dtensor/comm_debug.h"
#include "dtensor/dtensor.h"
#include "dtensor/optim.h"
#include "gpt/training.h"
#include "megatron_gpt.h"
#include "op_census.h"

namespace {

using namespace megatron;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSeed = 1234;
constexpr int64_t kBatch = 8;
constexpr int kDistinctBatches = 10;  // prepared before timing and cycled
constexpr int kWarmupSteps = 5;
constexpr int kStepsPerRound = 5;
constexpr int kCensusWarmupSteps = 5, kCensusSteps = 50;
constexpr double kFirstLossTolerance = 1e-5;
// Later warm-up steps compare the two parallel runs after AdamW updates, which amplify rounding.
constexpr double kLaterLossTolerance = 1e-4;

struct Args {
  int tp = 2;
  int rounds = 20;
};

Args parse(int argc, char** argv) {
  const bench::Flags flags(argc, argv, {"--tp", "--rounds"});
  Args args;
  args.tp = flags.number("--tp", args.tp);
  args.rounds = flags.number("--rounds", args.rounds);
  if (args.tp < 1 || args.rounds < 1) throw std::invalid_argument("--tp and --rounds must be positive");
  return args;
}

// Every model of a run starts from these same weights.
gpt::Gpt seeded_model(const gpt::Config& config) {
  torch::manual_seed(kSeed);
  return gpt::Gpt(config);
}

// The demo's AdamW (gpt::make_optimizer), over any parameters.
std::unique_ptr<torch::optim::Optimizer> adamw(const std::vector<at::Tensor>& parameters) {
  const gpt::TrainOptions train;
  return std::make_unique<torch::optim::AdamW>(parameters,
                                               torch::optim::AdamWOptions(train.lr).weight_decay(train.weight_decay));
}

// ---- Megatron-style tensor parallelism, written by hand ---------------------------------------------

// ---- timing --------------------------------------------------------------------------------------

// One implementation under test: how it computes the loss of a batch, and its AdamW.
struct Contender {
  std::string name;
  std::function<at::Tensor(const gpt::Batch&)> loss;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  int steps_done = 0;  // picks the next batch, so every contender sees the batches in the same order
  // One process alone (rank 0, with this many intra-op threads) while the other ranks sleep; 0: every
  // rank runs it.
  int solo_threads = 0;
  bool skip_all_reduces = false;  // hand-written only: TpGroup::skip_all_reduces during its steps
};

// Where the other ranks sleep (a store wait, not a polling collective) while rank 0 runs a solo step.
c10::intrusive_ptr<c10d::Store>& solo_store() {
  static c10::intrusive_ptr<c10d::Store> store;
  return store;
}

enum Phase { kForward, kBackward, kOptimizer, kLossRead, kStep, kPhases };

struct StepResult {
  double loss;
  std::array<double, kPhases> seconds;  // on this rank
};

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Called as each phase of a step ends (to count what the phase communicated).
using PhaseObserver = std::function<void(Phase)>;

// Starts after a barrier, so that every rank's clock starts with the slowest rank's previous step done.
StepResult step(Contender& c, const std::vector<gpt::Batch>& batches, const PhaseObserver& observe = {}) {
  const gpt::Batch& batch = batches[c.steps_done++ % batches.size()];
  auto phase_done = [&](Phase p) {
    if (observe) observe(p);
    return Clock::now();
  };
  tp_group().backend->barrier()->wait();
  if (c.solo_threads > 0 && tp_group().rank != 0) {  // rank 0 alone: wait without taking a core
    const std::string done = "solo/" + c.name + "/" + std::to_string(c.steps_done);
    solo_store()->wait({done});
    return {0, {}};
  }
  const int threads_before = at::get_num_threads();
  if (c.solo_threads > 0) at::set_num_threads(c.solo_threads);
  tp_group().skip_all_reduces = c.skip_all_reduces;
  const auto start = Clock::now();
  at::Tensor loss = c.loss(batch);
  const auto forward_done = phase_done(kForward);
  loss.backward();
  const auto backward_done = phase_done(kBackward);
  dtensor::step_on_local_shards(*c.optimizer);
  c.optimizer->zero_grad();
  const auto optimizer_done = phase_done(kOptimizer);
  const double value = gpt::value_of(loss);
  const auto end = phase_done(kLossRead);
  tp_group().skip_all_reduces = false;
  if (c.solo_threads > 0) {
    at::set_num_threads(threads_before);
    solo_store()->set("solo/" + c.name + "/" + std::to_string(c.steps_done), std::vector<uint8_t>{1});
  }
  return {value,
          {seconds_between(start, forward_done), seconds_between(forward_done, backward_done),
           seconds_between(backward_done, optimizer_done), seconds_between(optimizer_done, end),
           seconds_between(start, end)}};
}

double relative_difference(double a, double b) { return std::abs(a - b) / std::abs(b); }

// The first-step losses of the parallel runs equal the single-process one, and the warm-up steps after
// it (gradients and updates) agree between dtensor and hand-written. Throws on any rank that differs.
void check_losses(double single_process, const std::vector<double>& with_dtensor, const std::vector<double>& hand) {
  const double first =
      std::max(relative_difference(with_dtensor[0], single_process), relative_difference(hand[0], single_process));
  double later = 0;
  for (size_t i = 1; i < hand.size(); ++i) later = std::max(later, relative_difference(hand[i], with_dtensor[i]));
  if (tp_group().rank == 0)
    std::printf(
        "First-step loss: single process %.7f, dtensor %.7f, hand-written %.7f (largest relative difference "
        "%.1e, tolerance %.0e); warm-up steps 2-%zu, dtensor vs hand-written: %.1e (tolerance %.0e)\n\n",
        single_process, with_dtensor[0], hand[0], first, kFirstLossTolerance, hand.size(), later, kLaterLossTolerance);
  if (first > kFirstLossTolerance || later > kLaterLossTolerance)
    throw std::runtime_error(
        "sanity check failed: the hand-written model's losses differ from dtensor's or the "
        "single process's (see above); not timing");
}

// "7 + 6 + 0 + 1 = 14": the collectives of one step of `c` by phase, as `count_so_far` counts them.
std::string collectives_by_phase(Contender& c, const std::vector<gpt::Batch>& batches,
                                 const std::function<int64_t()>& count_so_far) {
  std::string out;
  const int64_t first = count_so_far();
  int64_t before = first;
  step(c, batches, [&](Phase p) {
    const int64_t now = count_so_far();
    out += (p == kForward ? "" : " + ") + std::to_string(now - before);
    before = now;
  });
  return out + " = " + std::to_string(before - first);
}

// What one step of each parallel implementation communicates, on rank 0.
void print_collectives(Contender& dtensor_run, Contender& hand, const std::vector<gpt::Batch>& batches) {
  std::string dtensor_phases, dtensor_detail;
  int64_t dtensor_bytes = 0, dtensor_ops = 0;
  {
    dtensor::CommDebugMode debug;
    dtensor_phases = collectives_by_phase(dtensor_run, batches, [&] { return debug.total_count(); });
    for (const auto& [op, kinds] : debug.counts_by_op())
      for (const auto& [kind, n] : kinds) dtensor_detail += "; " + op + " " + kind + " x" + std::to_string(n);
    for (const auto& c : debug.collectives()) dtensor_bytes += c.bytes;
    dtensor_ops = static_cast<int64_t>(debug.ops().size());
    if (std::getenv("DTENSOR_BENCH_OP_COUNTS") && tp_group().rank == 0) {  // which ops a step dispatches
      std::map<std::string, int> counts;
      for (const auto& op : debug.ops()) ++counts[op];
      std::vector<std::pair<int, std::string>> sorted;
      for (const auto& [op, n] : counts) sorted.emplace_back(n, op);
      std::sort(sorted.rbegin(), sorted.rend());
      for (const auto& [n, op] : sorted) std::printf("  %4d %s\n", n, op.c_str());
    }
  }
  TpGroup& group = tp_group();
  group.all_reduces.clear();
  group.all_reduce_bytes = 0;
  const std::string hand_phases = collectives_by_phase(hand, batches, [&] {
    int64_t n = 0;
    for (const auto& [purpose, count] : group.all_reduces) n += count;
    return n;
  });
  std::string hand_detail;
  for (const auto& [purpose, n] : group.all_reduces) hand_detail += "; " + purpose + " x" + std::to_string(n);
  if (group.rank != 0) return;
  std::printf("Collectives per step (rank 0), forward + backward + optimizer + loss read:\n");
  std::printf("- dtensor: %s collectives (%lld bytes; %lld ops on DTensors dispatched)%s\n", dtensor_phases.c_str(),
              static_cast<long long>(dtensor_bytes), static_cast<long long>(dtensor_ops), dtensor_detail.c_str());
  std::printf("- hand-written: %s all-reduces (%lld bytes)%s\n\n", hand_phases.c_str(),
              static_cast<long long>(group.all_reduce_bytes), hand_detail.c_str());
}

// Rounds of kStepsPerRound steps per contender. Each round runs the two parallel contenders (the last
// two) step by step in turn, which one goes first alternating, then the single-process ones, their
// order turning every two rounds. In turn, not one's steps after the other's: the machine's pace
// (Gloo's wake-ups on oversubscribed cores above all) drifts over seconds, which five steps of one
// followed by five of the other took into their ratio. The step after a single-process run pays for it (at TP > 1 the other ranks
// wake from a store wait and the scheduler places them anew; rank 0's intra-op threads may still
// spin), so the parallel contenders must each follow every single-process one equally often. A plain
// rotation of all four let dtensor follow the 2-thread run in three rounds of four and hand-written
// in one, which at TP=4 (4 ranks on 2 cores) showed as rounds in which dtensor alone ran 1.5x slower.
// Returns each step's phase times in ms as the maximum over ranks: [contender, step, phase].
at::Tensor time_rounds(std::vector<Contender>& contenders, const std::vector<gpt::Batch>& batches, int rounds) {
  const int64_t n = static_cast<int64_t>(contenders.size());
  at::Tensor times = at::zeros({n, static_cast<int64_t>(rounds) * kStepsPerRound, kPhases}, at::kDouble);
  auto t = times.accessor<double, 3>();
  for (int round = 0; round < rounds; ++round) {
    auto timed_step = [&](int64_t c, int s) {
      const StepResult r = step(contenders[c], batches);
      for (int p = 0; p < kPhases; ++p) t[c][round * kStepsPerRound + s][p] = r.seconds[p] * 1e3;
    };
    const int64_t first = n - 2 + round % 2, second = n - 1 - round % 2;
    for (int s = 0; s < kStepsPerRound; ++s) {
      timed_step(first, s);
      timed_step(second, s);
    }
    for (int64_t k = 0; k < n - 2; ++k)
      for (int s = 0; s < kStepsPerRound; ++s) timed_step((round / 2 + k) % (n - 2), s);
  }
  all_reduce_(times, c10d::ReduceOp::MAX, "step times (max over ranks)");
  return times;
}

// One row per contender: the median over steps of each phase; the ratio is to the last contender's step.
// Then the parallel runs' throughput over the fastest single process (the first contenders).
void print_table(const std::vector<Contender>& contenders, const at::Tensor& times_ms, int tp,
                 int64_t tokens_per_step) {
  std::printf(
      "| implementation | TP | step ms | forward ms | backward ms | optimizer ms | loss read ms | tokens/s | "
      "step / hand-written step |\n");
  std::printf("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  auto median_ms = [&](size_t c, Phase p) { return times_ms[c].select(-1, p).median().item<double>(); };
  const double hand_ms = median_ms(contenders.size() - 1, kStep);
  size_t fastest_single = 0;
  for (size_t c = 0; c < contenders.size(); ++c) {
    const double ms = median_ms(c, kStep);
    const bool single = c + 2 < contenders.size();
    if (single && ms < median_ms(fastest_single, kStep)) fastest_single = c;
    std::printf("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %.3f |\n", contenders[c].name.c_str(),
                single ? 1 : tp, ms, median_ms(c, kForward), median_ms(c, kBackward), median_ms(c, kOptimizer),
                median_ms(c, kLossRead), tokens_per_step / (ms * 1e-3), ms / hand_ms);
  }
  // Machine noise moves whole rounds; each round times both parallel runs back to back, so the ratio
  // within a round is the steadier figure. Its spread over rounds says how far to trust the table's.
  const int64_t rounds = times_ms.size(1) / kStepsPerRound;
  std::vector<double> ratios;
  for (int64_t r = 0; r < rounds; ++r) {
    auto round_ms = [&](size_t c) {
      return times_ms[c].narrow(0, r * kStepsPerRound, kStepsPerRound).select(-1, kStep).median().item<double>();
    };
    ratios.push_back(round_ms(contenders.size() - 2) / round_ms(contenders.size() - 1));
  }
  std::printf("\ndtensor / hand-written within each round (paired): %s\n", bench::ratio_summary(ratios).c_str());
  if (tp == 1) return;
  const double single_ms = median_ms(fastest_single, kStep);
  std::printf("\nTokens/s over the fastest single process (%s): dtensor %.2fx, hand-written %.2fx\n",
              contenders[fastest_single].name.c_str(), single_ms / median_ms(contenders.size() - 2, kStep),
              single_ms / hand_ms);
}

int run(const std::shared_ptr<dtensor::World>& world, const Args& args) {
  at::set_num_threads(1);  // one core per rank
  const gpt::Corpus corpus = gpt::load_corpus(dtensor::build_paths::gpt_corpus);
  const gpt::Config config = gpt::demo_config(corpus);
  const auto mesh = dtensor::DeviceMesh::create(world, {world->size()}, {.dim_names = {"tp"}});
  tp_group() = {mesh->group(0), world->rank(), world->size()};
  solo_store() = world->store();
  if (world->rank() == 0)
    std::printf("Backend: %s (ranks started by %s)\n\n", dtensor::to_string(mesh->backend()).c_str(),
                world->launcher().c_str());

  gpt::Batches stream(corpus, kBatch, config.seq_len, kSeed);
  std::vector<gpt::Batch> batches;
  for (int i = 0; i < kDistinctBatches; ++i) batches.push_back(stream.next());

  gpt::Gpt single = seeded_model(config);
  double single_loss;
  {
    at::NoGradGuard no_grad;
    single_loss = single->forward(batches[0].tokens, batches[0].targets).item<double>();
  }
  auto hand = std::make_shared<MegatronGpt>(single, config);  // shards copied before `single` trains
  gpt::Gpt parallel = seeded_model(config);
  gpt::parallelize(parallel, mesh);

  // The last two are the parallel runs, dtensor then hand-written (the reference of the ratios).
  // The single-process baselines: at TP=1 in the timed process itself; at TP>1 run by rank 0 alone with
  // one intra-op thread and with one per core, while the other ranks sleep.
  std::vector<Contender> contenders;
  const auto plain = [&](const std::string& name, int solo_threads) {
    gpt::Gpt model = seeded_model(config);
    contenders.push_back({name, [model](const gpt::Batch& b) mutable { return dtensor::call(model, b.tokens, b.targets); },
                          adamw(model->parameters()), 0, solo_threads});
  };
  if (args.tp == 1) {
    plain("plain LibTorch, 1 process", 0);
  } else {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    plain("plain LibTorch, 1 process, 1 thread", 1);
    if (cores > 1) plain("plain LibTorch, 1 process, " + std::to_string(cores) + " threads", cores);
  }
  contenders.push_back(
      {"dtensor", [parallel](const gpt::Batch& b) mutable { return dtensor::call(parallel, b.tokens, b.targets); },
       adamw(parallel->parameters())});
  contenders.push_back({"hand-written Megatron",
                        [hand](const gpt::Batch& b) { return hand->forward(b.tokens, b.targets); },
                        adamw(hand->parameters())});
  Contender& dtensor_run = contenders[contenders.size() - 2];
  Contender& hand_run = contenders.back();

  std::vector<std::vector<double>> warmup_losses(contenders.size());
  for (size_t c = 0; c < contenders.size(); ++c)
    for (int s = 0; s < kWarmupSteps; ++s) warmup_losses[c].push_back(step(contenders[c], batches).loss);
  check_losses(single_loss, warmup_losses[contenders.size() - 2], warmup_losses.back());
  if (std::getenv("DTENSOR_OP_CENSUS")) {  // what each implementation's step runs, instead of timing
    for (Contender* c : {&dtensor_run, &hand_run}) {
      std::unique_ptr<bench::OpCensus> census;
      for (int s = 0; s < kCensusWarmupSteps + kCensusSteps; ++s) {
        if (s == kCensusWarmupSteps) census = std::make_unique<bench::OpCensus>();
        step(*c, batches);
      }
      if (world->rank() == 0) bench::OpCensus::print(c->name, kCensusSteps);
    }
    return 0;
  }
  if (const char* only = std::getenv("DTENSOR_BENCH_ONLY")) {  // one contender's steps alone, to profile it
    Contender& c = std::string(only) == "hand" ? hand_run : dtensor_run;
    for (int s = 0; s < args.rounds * kStepsPerRound; ++s) step(c, batches);
    return 0;
  }
  print_collectives(dtensor_run, hand_run, batches);
  if (std::getenv("DTENSOR_BENCH_SKIP_ALL_REDUCES")) {
    hand_run.skip_all_reduces = true;
    hand_run.name += ", all-reduces skipped (wrong values)";
  }

  const auto times = time_rounds(contenders, batches, args.rounds);
  if (world->rank() == 0) print_table(contenders, times, args.tp, kBatch * config.seq_len);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return dtensor::run_local_ranks(argc, argv, dtensor::LaunchOptions{.nprocs = args.tp},
                                  [&](const std::shared_ptr<dtensor::World>& world) { return run(world, args); });
}
