// Training-step time and peak memory of the GPT (examples/gpt) under fully sharded data parallelism:
// dtensor's fully_shard next to a hand-written ZeRO-3 over raw c10d, in the same processes, alternating
// rounds of steps so that both see the same machine noise. Every rank trains on its own batch of 8.
// Rank 0 prints Markdown table rows; bench/fsdp.sh (./dev bench fsdp) runs the configurations and
// PyTorch's own fully_shard (bench/fsdp_pytorch.py) beside them.
//
//   dtensor_fsdp_bench [--config demo|large] [--tp 1|2] [--replicas 1|2] [--impl both|dtensor|floor]
//                      [--reshard 0|1] [--overlap 0|1] [--rounds R] [--ranks N]
//
// --config demo: the main job's model (0.41M parameters); large: dim 512, 8 heads, 8 layers, ffn 2048
// (25.3M). --tp 2: FSDP over half the ranks x TP=2 (dtensor only). --replicas 2: HSDP, 2 replicas x FSDP
// over half the ranks, every rank on its own batch (dtensor only). --impl dtensor: dtensor alone, so
// that the process's peak RSS is dtensor's. --impl floor: the compute floor alone, the whole model's
// forward and backward on each rank's batch with no communication and no optimizer step, which every
// data-parallel step contains (4 ranks computing at once on these cores, as in the other runs).
// --reshard 0: fully_shard's reshard_after_forward off. --overlap 0: FullyShardOptions::overlap off
// (every collective blocks). --ranks N: N local ranks (default 4; 2 leaves a core to each rank).
//
// The hand-written ZeRO-3 keeps each group's parameters as views of one flat buffer [N x S] (the
// parameters back to back, padded to a multiple of N; FSDP1's flat parameter), all-gathers a group's
// flat shard into it before the group's forward (a forward pre-hook), lets autograd accumulate the
// gradients into a flat gradient buffer they are views of, reduce-scatters each group's buffer after
// backward, and steps AdamW on the flat shards (both in ATen's fused kernel: step_on_local_shards with
// fused on, as dtensor's). It never frees the gathered buffer, so it does the
// communication of fully_shard with reshard_after_forward off: one all-gather and one reduce-scatter
// per group and step.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "build_paths.h"
#include "flags.h"
#include "dtensor/dtensor.h"
#include "dtensor/fsdp.h"
#include "dtensor/optim.h"
#include "gpt/training.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kSeed = 1234;
constexpr int64_t kBatch = 8;  // per rank
constexpr int kDistinctBatches = 4;
constexpr int kWarmupSteps = 3;
constexpr int kStepsPerRound = 3;
constexpr double kLossTolerance = 1e-4;

struct Args {
  std::string config = "demo";
  int tp = 1;
  int replicas = 1;
  std::string impl = "both";
  bool reshard = true;
  bool overlap = true;
  int rounds = 10;
  int ranks = 4;
};

Args parse(int argc, char** argv) {
  const bench::Flags flags(argc, argv, {"--config", "--tp", "--replicas", "--impl", "--reshard", "--overlap", "--rounds", "--ranks"});
  Args args;
  args.config = flags.text("--config", args.config);
  args.tp = flags.number("--tp", args.tp);
  args.replicas = flags.number("--replicas", args.replicas);
  args.impl = flags.text("--impl", args.impl);
  args.reshard = flags.text("--reshard", "1") != "0";
  args.overlap = flags.text("--overlap", "1") != "0";
  args.rounds = flags.number("--rounds", args.rounds);
  args.ranks = flags.number("--ranks", args.ranks);
  if ((args.config != "demo" && args.config != "large") || (args.tp != 1 && args.tp != 2) ||
      (args.replicas != 1 && args.replicas != 2) || (args.tp == 2 && args.replicas == 2) ||
      (args.impl != "both" && args.impl != "dtensor" && args.impl != "floor") || args.rounds < 1 || args.ranks < 2 ||
      args.ranks % 2 != 0)
    throw std::invalid_argument("--config demo|large, --tp 1|2 or --replicas 1|2, --impl both|dtensor|floor, --rounds R >= 1, --ranks N even >= 2");
  if ((args.tp == 2 || args.replicas == 2) && args.impl == "both") args.impl = "dtensor";  // the hand-written run is FSDP alone
  return args;
}

gpt::Config config_of(const std::string& name, const gpt::Corpus& corpus) {
  gpt::Config c = gpt::demo_config(corpus);
  if (name == "large") {
    c.dim = 512;
    c.heads = 8;
    c.layers = 8;
    c.ffn = 2048;
  }
  return c;
}

gpt::Gpt seeded_model(const gpt::Config& config) {
  torch::manual_seed(kSeed);
  return gpt::Gpt(config);
}

torch::optim::AdamWOptions adamw_options() {
  const gpt::TrainOptions train;
  return torch::optim::AdamWOptions(train.lr).weight_decay(train.weight_decay);
}

// One implementation: a step's loss (forward and backward done), then its optimizer step.
struct Contender {
  std::string name;
  std::function<at::Tensor(const gpt::Batch&)> forward_backward;
  std::function<void()> optimizer_step;
};

// ---- hand-written ZeRO-3 over raw c10d --------------------------------------------------------------

class FlatGroup {
 public:
  FlatGroup(std::vector<at::Tensor> params, c10::intrusive_ptr<c10d::Backend> group)
      : params_(std::move(params)), group_(std::move(group)) {
    const int64_t n = group_->getSize();
    int64_t total = 0;
    for (const at::Tensor& p : params_) total += p.numel();
    shard_numel_ = (total + n - 1) / n;
    whole_ = at::zeros({n * shard_numel_});
    grads_ = at::zeros({n * shard_numel_});
    int64_t offset = 0;
    at::NoGradGuard no_grad;
    for (at::Tensor& p : params_) {
      whole_.narrow(0, offset, p.numel()).copy_(p.reshape(-1));
      p.set_data(whole_.narrow(0, offset, p.numel()).view(p.sizes()));
      p.mutable_grad() = grads_.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
    }
    shard_ = whole_.narrow(0, group_->getRank() * shard_numel_, shard_numel_).clone();
    shard_.mutable_grad() = at::zeros({shard_numel_});
  }
  void gather() {
    at::Tensor shard = shard_.detach();
    group_->_allgather_base(whole_, shard)->wait();
  }
  void reduce() {
    c10d::ReduceScatterOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    at::Tensor grad = shard_.mutable_grad();
    group_->_reduce_scatter_base(grad, grads_, options)->wait();
    grad.div_(static_cast<double>(group_->getSize()));
    grads_.zero_();
  }
  const at::Tensor& shard() const { return shard_; }

 private:
  std::vector<at::Tensor> params_;
  c10::intrusive_ptr<c10d::Backend> group_;
  int64_t shard_numel_ = 0;
  at::Tensor whole_, grads_, shard_;
};

struct HandZero3 {
  gpt::Gpt model;
  std::vector<std::unique_ptr<FlatGroup>> groups;  // one per block, then the root's rest
  std::unique_ptr<torch::optim::AdamW> optimizer;

  HandZero3(const gpt::Config& config, const c10::intrusive_ptr<c10d::Backend>& group) : model(seeded_model(config)) {
    std::vector<torch::nn::Module*> owners;
    for (const auto& block : *model->blocks) {
      groups.push_back(std::make_unique<FlatGroup>(block->parameters(), group));
      owners.push_back(block.get());
    }
    std::vector<at::Tensor> rest;
    for (const auto& item : model->named_parameters())
      if (item.key().rfind("blocks.", 0) != 0) rest.push_back(item.value());
    groups.push_back(std::make_unique<FlatGroup>(rest, group));
    owners.push_back(model.get());
    for (size_t i = 0; i < groups.size(); ++i)
      dtensor::register_forward_pre_hook(*owners[i], [g = groups[i].get()](torch::nn::Module&, std::vector<at::Tensor>&) {
        g->gather();
      });
    std::vector<at::Tensor> shards;
    for (const auto& g : groups) shards.push_back(g->shard());
    optimizer = std::make_unique<torch::optim::AdamW>(shards, adamw_options());
  }
  at::Tensor forward_backward(const gpt::Batch& batch) {
    at::Tensor loss = dtensor::call(model, batch.tokens, batch.targets);
    loss.backward();
    for (const auto& g : groups) g->reduce();
    return loss;
  }
};

// ---- timing ----------------------------------------------------------------------------------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return dtensor::run_local_ranks(argc, argv, dtensor::LaunchOptions{.nprocs = args.ranks}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);
    const int rank = static_cast<int>(world->rank()), n = static_cast<int>(world->size());
    const gpt::Corpus corpus = gpt::load_corpus(dtensor::build_paths::gpt_corpus);
    const gpt::Config config = config_of(args.config, corpus);
    auto everyone = dtensor::DeviceMesh::create(world, {n}, {.dim_names = {"dp"}});
    dtensor::MeshPtr mesh = everyone, dp = everyone;
    if (args.tp == 2) {
      mesh = dtensor::DeviceMesh::create(world, {n / 2, 2}, {.dim_names = {"dp", "tp"}});
      dp = (*mesh)["dp"];
    } else if (args.replicas == 2) {
      mesh = dtensor::DeviceMesh::create(world, {2, n / 2}, {.dim_names = {"replicate", "dp"}});  // every rank its own data
    }
    const int64_t dp_rank = (*dp->coordinate())[0];
    std::vector<gpt::Batch> batches;
    gpt::Batches source(corpus, kBatch, config.seq_len, kSeed + static_cast<uint64_t>(dp_rank));
    for (int i = 0; i < kDistinctBatches; ++i) batches.push_back(source.next());

    std::vector<Contender> contenders;
    if (args.impl == "floor") {
      gpt::Gpt whole = seeded_model(config);
      contenders.push_back({"compute floor (forward and backward, no communication)",
                            [whole](const gpt::Batch& b) mutable {
                              at::Tensor loss = dtensor::call(whole, b.tokens, b.targets);
                              loss.backward();
                              return loss;
                            },
                            [whole]() mutable { whole->zero_grad(); }});
    }
    gpt::Gpt model{nullptr};
    std::unique_ptr<torch::optim::AdamW> optimizer;
    if (args.impl != "floor") {
      model = seeded_model(config);
      if (args.tp == 2) gpt::parallelize(model, (*mesh)["tp"]);
      gpt::fully_shard(model, mesh, {.reshard_after_forward = args.reshard, .overlap = args.overlap});
      optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), adamw_options());
      contenders.push_back({"dtensor fully_shard",
                            [&](const gpt::Batch& b) {
                              at::Tensor loss = dtensor::call(model, b.tokens, b.targets);
                              loss.backward();
                              return loss;
                            },
                            [&] {
                              dtensor::step_on_local_shards(*optimizer, {.fused = true});
                              optimizer->zero_grad();
                            }});
    }
    std::unique_ptr<HandZero3> hand;
    if (args.impl == "both") {
      hand = std::make_unique<HandZero3>(config, everyone->group(0));
      contenders.push_back({"hand-written ZeRO-3", [&](const gpt::Batch& b) { return hand->forward_backward(b); },
                            [&] { dtensor::step_on_local_shards(*hand->optimizer, {.fused = true}); }});
    }

    auto barrier = [&] { everyone->group(0)->barrier()->wait(); };
    std::vector<int> steps_done(contenders.size(), 0);
    auto step = [&](size_t c) {
      const gpt::Batch& batch = batches[steps_done[c]++ % batches.size()];
      barrier();
      const auto start = Clock::now();
      at::Tensor loss = contenders[c].forward_backward(batch);
      contenders[c].optimizer_step();
      const double value = gpt::value_of(loss);
      return std::make_pair(value, std::chrono::duration<double>(Clock::now() - start).count());
    };
    // Warm-up, and the sanity check: the contenders' losses agree step for step.
    std::vector<std::vector<double>> losses(contenders.size());
    for (int s = 0; s < kWarmupSteps; ++s)
      for (size_t c = 0; c < contenders.size(); ++c) losses[c].push_back(step(c).first);
    for (size_t c = 1; c < contenders.size(); ++c)
      for (int s = 0; s < kWarmupSteps; ++s)
        if (std::abs(losses[c][s] - losses[0][s]) > kLossTolerance * std::abs(losses[0][s]))
          throw std::runtime_error("sanity check failed: " + contenders[c].name + "'s loss at warm-up step " +
                                   std::to_string(s + 1) + " differs from dtensor's");

    std::vector<std::vector<double>> times(contenders.size());
    std::vector<double> ratios;  // dtensor over hand-written, per round (medians of the round's steps)
    for (int round = 0; round < args.rounds; ++round) {
      std::vector<double> round_median(contenders.size());
      for (size_t k = 0; k < contenders.size(); ++k) {
        const size_t c = (k + static_cast<size_t>(round)) % contenders.size();  // alternate who goes first
        std::vector<double> round_times;
        for (int s = 0; s < kStepsPerRound; ++s) round_times.push_back(step(c).second);
        times[c].insert(times[c].end(), round_times.begin(), round_times.end());
        round_median[c] = median(round_times);
      }
      if (contenders.size() == 2) ratios.push_back(round_median[0] / round_median[1]);
    }
    // Peak RSS: the largest over ranks (MiB, as an integer through the world's sum of one-hot values).
    const int64_t rss = static_cast<int64_t>(peak_rss_mib());
    int64_t max_rss = 0;
    for (int r = 0; r < n; ++r) max_rss = std::max(max_rss, world->sum_across_ranks(r == rank ? rss : 0));
    if (rank == 0) {
      const std::string backend = dtensor::to_string(mesh->backend());
      const std::string layout = args.tp == 2         ? "FSDP=" + std::to_string(n / 2) + " x TP=2"
                                 : args.replicas == 2 ? "HSDP: 2 replicas x FSDP=" + std::to_string(n / 2)
                                                      : "FSDP=" + std::to_string(n);
      for (size_t c = 0; c < contenders.size(); ++c) {
        std::printf("| %s | %s | %s | %s | %.1f | %.1f-%.1f |", args.config.c_str(), layout.c_str(),
                    contenders[c].name.c_str(), backend.c_str(), 1e3 * median(times[c]), 1e3 * quantile(times[c], 0.25),
                    1e3 * quantile(times[c], 0.75));
        if (args.impl != "both") std::printf(" %lld |\n", static_cast<long long>(max_rss));
        else std::printf(" (both in one process) |\n");
      }
      if (!ratios.empty())
        std::printf("\nRatio dtensor / hand-written per round (%s, %s, %s, reshard_after_forward %s, overlap %s): median %.3f, middle half %.3f-%.3f\n\n",
                    args.config.c_str(), layout.c_str(), backend.c_str(), args.reshard ? "on" : "off", args.overlap ? "on" : "off", median(ratios),
                    quantile(ratios, 0.25), quantile(ratios, 0.75));
    }
    return 0;
  });
}
