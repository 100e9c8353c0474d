// Pipeline-parallel training step of the GPT (examples/gpt, deeper): dtensor's PipelineRunner with
// GPipe, 1F1B, Interleaved 1F1B, ZBV and DualPipeV next to a hand-written 1F1B over raw c10d send/recv, in the
// same processes, taking turns round by round. Rank 0 prints Markdown table rows; bench/pp_step.sh
// (./dev bench pp) runs it on MPI and Gloo, and PyTorch's own pipelining (bench/pp_pytorch.py) beside it.
//
//   dtensor_pp_step_bench [--config deep|small] [--ranks P] [--microbatches M] [--rounds R]
//
// Per implementation: the step time (maximum over ranks, after a barrier: forward, backward, AdamW,
// zero_grad), the bubble (each rank's time not spent computing, over the schedule's part of the step
// (forwards, backwards and transfers; the slowest rank's), averaged over ranks;
// computing is what the runner's compute_seconds() counts: forwards, the loss and backwards, and the
// same for the hand-written run), and the peak activation memory (the most bytes the step's forward and
// backward hold beyond what the rank held before it, counted by a CPU allocator that wraps LibTorch's,
// the maximum over ranks).
//
// The hand-written 1F1B knows every shape in advance, sends with isend and receives with a blocking
// recv (one c10d tag, FIFO per direction), and runs warm-up forwards, one-forward-one-backward, then
// the remaining backwards: the schedule of Narayanan et al. that PyTorch's Schedule1F1B and dtensor's
// one_f_one_b build.
//
// The compute floor runs each rank's 1F1B stage on every microbatch with nothing else (ComputeFloor):
// the compute a step of that split holds.

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/optim/adamw.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "build_paths.h"
#include "flags.h"
#include "dtensor/dtensor.h"
#include "dtensor/pipeline.h"
#include "dtensor/pipeline_split.h"
#include "gpt/pipeline.h"
#include "gpt/training.h"
#include "ratio_summary.h"

namespace {

namespace pp = dtensor::pipeline;
using Clock = std::chrono::steady_clock;
constexpr uint64_t kSeed = 1234;
constexpr int64_t kMicrobatchSize = 4;
constexpr int kWarmupSteps = 2, kStepsPerRound = 3;
constexpr double kLossTolerance = 1e-5;

struct Args {
  std::string config = "deep";
  int ranks = 2;
  int microbatches = 8;
  int rounds = 10;
};

Args parse(int argc, char** argv) {
  const bench::Flags flags(argc, argv, {"--config", "--ranks", "--microbatches", "--rounds"});
  Args args;
  args.config = flags.text("--config", args.config);
  args.ranks = flags.number("--ranks", args.ranks);
  args.microbatches = flags.number("--microbatches", args.microbatches);
  args.rounds = flags.number("--rounds", args.rounds);
  if ((args.config != "deep" && args.config != "small") || args.ranks < 2 || args.microbatches < args.ranks || args.rounds < 1)
    throw std::invalid_argument("--config deep|small, --ranks P >= 2, --microbatches M >= P, --rounds R >= 1");
  return args;
}

// deep: the GPT of the main job, 8 blocks deep (enough for 2 stages per rank on 4 ranks); small: 4
// blocks of a quarter of its width, where what a pipeline runtime spends per action shows.
gpt::Config config_of(const std::string& name, const gpt::Corpus& corpus) {
  gpt::Config c = gpt::demo_config(corpus);
  c.layers = 8;
  if (name == "small") {
    c.layers = 4;
    c.dim = 32;
    c.heads = 4;
    c.ffn = 128;
  }
  return c;
}

// LibTorch's CPU allocator, counting the bytes it has handed out and not yet had back. Its pointers are
// their own contexts, as LibTorch's raw allocations require.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr inner = base_->allocate(bytes);
    void* data = inner.get();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_ += static_cast<int64_t>(bytes);
      peak_ = std::max(peak_, live_);
      held_.emplace(data, Held{bytes, std::move(inner)});  // frees itself, through the base's deleter, when dropped
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  // The peak from now on starts at what is held now.
  void start_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = live_;
  }
  int64_t peak_above(int64_t start) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_ - start;
  }
  int64_t live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_;
  }

 private:
  struct Held {
    size_t bytes;
    c10::DataPtr inner;
  };
  static void release(void* data);
  c10::Allocator* base_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Held> held_;
  int64_t live_ = 0, peak_ = 0;
};

CountingAllocator& counting_allocator() {
  static CountingAllocator* allocator = [] {
    auto* a = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return *allocator;
}

void CountingAllocator::release(void* data) {
  CountingAllocator& self = counting_allocator();
  c10::DataPtr inner;  // freed when this returns, outside the lock
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    const auto it = self.held_.find(data);
    if (it == self.held_.end()) throw std::logic_error("CountingAllocator: freeing a pointer it did not hand out");
    self.live_ -= static_cast<int64_t>(it->second.bytes);
    inner = std::move(it->second.inner);
    self.held_.erase(it);
  }
}

// What one step of an implementation measured on this rank.
struct StepSample {
  double seconds = 0, compute_seconds = 0, loss = 0;  // loss: on the rank holding the last stage, else 0
  double pipeline_seconds = 0;                        // the schedule's part: forwards, backwards, transfers
  int64_t activation_bytes = 0;
};

// One implementation: a model of its own (every one from the same seed), its pipeline, its optimizer.
struct Contender {
  std::string name, schedule;
  int stages = 0;
  double theory_bubble = -1;  // < 0: no closed form printed
  std::function<StepSample(const gpt::Batch&)> step;
  bool trains = true;  // false: the compute floor, which has no bubble, memory or loss to print
};

gpt::Gpt seeded_model(const gpt::Config& config) {
  torch::manual_seed(kSeed);
  return gpt::Gpt(config);
}

torch::optim::AdamWOptions adamw_options() {
  const gpt::TrainOptions train;
  return torch::optim::AdamWOptions(train.lr).weight_decay(train.weight_decay);
}

// The model's pieces spread over `stages` stages, and those `placed_here` says this rank runs.
std::vector<pp::PipelineStage> stages_of(gpt::Gpt& model, int stages, const std::function<bool(int)>& placed_here) {
  const auto pieces = gpt::pipeline_pieces(model);
  std::vector<pp::PipelineStage> mine;
  for (pp::PipelineStage& stage : pp::split_at(pieces, pp::even_split_points(pieces, "blocks.", stages)))
    if (placed_here(stage.index)) mine.push_back(std::move(stage));
  return mine;
}

// Zeroed in place, not dropped: the next step's gradients are then not among its peak's new bytes.
void zero_grads(const std::vector<at::Tensor>& parameters) {
  for (const at::Tensor& p : parameters)
    if (p.grad().defined()) p.grad().zero_();
}

Contender dtensor_contender(const std::string& schedule_name, const pp::Schedule& schedule, const gpt::Config& config,
                            const dtensor::MeshPtr& mesh, double theory_bubble) {
  auto model = std::make_shared<gpt::Gpt>(seeded_model(config));
  const int rank = static_cast<int>(mesh->local_rank(0));
  auto stages = stages_of(*model, schedule.num_stages, [&](int s) { return schedule.rank_of(s) == rank; });
  std::vector<at::Tensor> parameters;
  for (const pp::PipelineStage& s : stages) parameters.insert(parameters.end(), s.parameters.begin(), s.parameters.end());
  auto optimizer = std::make_shared<torch::optim::AdamW>(parameters, adamw_options());
  auto runner = std::make_shared<pp::PipelineRunner>(schedule, std::move(stages), mesh, 0, gpt::pipeline_loss);
  auto step = [model, optimizer, runner, parameters](const gpt::Batch& batch) {
    StepSample sample;
    CountingAllocator& memory = counting_allocator();
    const int64_t before = memory.live();
    memory.start_peak();
    const auto start = Clock::now();
    const at::Tensor loss = runner->step(batch.tokens, batch.targets);
    sample.pipeline_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    sample.activation_bytes = memory.peak_above(before);
    optimizer->step();
    zero_grads(parameters);
    sample.loss = loss.defined() ? loss.item<double>() : 0;
    sample.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    sample.compute_seconds = runner->compute_seconds();
    return sample;
  };
  return {"dtensor PipelineRunner", schedule_name, schedule.num_stages, theory_bubble, step};
}

// The hand-written 1F1B over raw c10d (see the top of the file).
class HandWritten1F1B {
 public:
  HandWritten1F1B(const gpt::Config& config, const dtensor::MeshPtr& mesh, int microbatches)
      : model_(seeded_model(config)), group_(mesh->group(0)), rank_(static_cast<int>(mesh->local_rank(0))),
        ranks_(static_cast<int>(mesh->size(0))), microbatches_(microbatches), dim_(config.dim), seq_(config.seq_len) {
    auto mine = stages_of(model_, ranks_, [&](int s) { return s == rank_; });
    stage_ = std::move(mine.at(0));
    optimizer_ = std::make_shared<torch::optim::AdamW>(stage_.parameters, adamw_options());
  }

  StepSample step(const gpt::Batch& batch) {
    StepSample sample;
    CountingAllocator& memory = counting_allocator();
    const int64_t before = memory.live();
    memory.start_peak();
    const auto start = Clock::now();
    compute_ = loss_ = 0;
    tokens_ = at::tensor_split(batch.tokens, microbatches_);
    targets_ = at::tensor_split(batch.targets, microbatches_);
    inputs_.assign(microbatches_, at::Tensor());
    outputs_.assign(microbatches_, at::Tensor());
    const int warmup = std::min(ranks_ - rank_ - 1, microbatches_);
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k + warmup < microbatches_; ++k) {
      forward(k + warmup);
      backward(k);
    }
    for (int k = microbatches_ - warmup; k < microbatches_; ++k) backward(k);
    for (auto& work : sends_) work->wait();
    sends_.clear();
    in_flight_.clear();
    sample.pipeline_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    sample.activation_bytes = memory.peak_above(before);
    optimizer_->step();
    zero_grads(stage_.parameters);
    sample.loss = loss_;
    sample.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    sample.compute_seconds = compute_;
    return sample;
  }

 private:
  bool last() const { return rank_ == ranks_ - 1; }
  at::Tensor activation_buffer() const { return at::empty({kMicrobatchSize, seq_, dim_}); }
  void send(const at::Tensor& t, int peer) {
    std::vector<at::Tensor> tensors = {t.detach().contiguous()};
    sends_.push_back(group_->send(tensors, peer, 0));
    in_flight_.push_back(tensors[0]);
  }
  at::Tensor recv(int peer) {
    std::vector<at::Tensor> tensors = {activation_buffer()};
    group_->recv(tensors, peer, 0)->wait();
    return tensors[0];
  }

  void forward(int k) {
    at::Tensor input = rank_ == 0 ? tokens_[k] : recv(rank_ - 1).requires_grad_(true);
    const auto start = Clock::now();
    at::Tensor output = stage_.forward(input);
    if (last()) {
      const at::Tensor loss = gpt::pipeline_loss(output, targets_[k]);
      loss_ += loss.item<double>() / microbatches_;
      output = loss / microbatches_;
    }
    compute_ += std::chrono::duration<double>(Clock::now() - start).count();
    if (!last()) send(output, rank_ + 1);
    inputs_[k] = input;
    outputs_[k] = output;
  }

  void backward(int k) {
    const at::Tensor grad = last() ? at::Tensor() : recv(rank_ + 1);
    const auto start = Clock::now();
    if (last()) outputs_[k].backward();
    else outputs_[k].backward(grad);
    compute_ += std::chrono::duration<double>(Clock::now() - start).count();
    if (rank_ > 0) send(inputs_[k].grad(), rank_ - 1);
    inputs_[k] = outputs_[k] = at::Tensor();
  }

  gpt::Gpt model_;
  pp::PipelineStage stage_;
  std::shared_ptr<torch::optim::AdamW> optimizer_;
  c10::intrusive_ptr<c10d::Backend> group_;
  int rank_, ranks_, microbatches_;
  int64_t dim_, seq_;
  std::vector<at::Tensor> tokens_, targets_, inputs_, outputs_, in_flight_;
  std::vector<c10::intrusive_ptr<c10d::Work>> sends_;
  double compute_ = 0, loss_ = 0;
};

// The compute floor: each rank's 1F1B stage runs the forward and backward of every microbatch alone,
// on stand-in activations and gradients of the transfers' shapes: no transfer, no wait, no optimizer
// step, the ranks computing at once, a core each, as in the runs. A pipeline step of this split on
// these kernels adds transfers, bubbles and the optimizer to it: a goal against another
// implementation's step is measured against this floor.
class ComputeFloor {
 public:
  ComputeFloor(const gpt::Config& config, const dtensor::MeshPtr& mesh, int microbatches)
      : model_(seeded_model(config)), rank_(static_cast<int>(mesh->local_rank(0))), ranks_(static_cast<int>(mesh->size(0))),
        microbatches_(microbatches) {
    stage_ = std::move(stages_of(model_, ranks_, [&](int s) { return s == rank_; }).at(0));
    for (int k = 0; k < microbatches_; ++k) {
      activations_.push_back(at::randn({kMicrobatchSize, config.seq_len, config.dim}));
      gradients_.push_back(at::randn({kMicrobatchSize, config.seq_len, config.dim}) * 1e-3);
    }
  }

  StepSample step(const gpt::Batch& batch) {
    const std::vector<at::Tensor> tokens = at::tensor_split(batch.tokens, microbatches_), targets = at::tensor_split(batch.targets, microbatches_);
    const auto start = Clock::now();
    for (int k = 0; k < microbatches_; ++k) {
      const at::Tensor input = rank_ == 0 ? tokens[k] : activations_[k].detach().requires_grad_(true);
      const at::Tensor output = stage_.forward(input);
      if (rank_ == ranks_ - 1) (gpt::pipeline_loss(output, targets[k]) / microbatches_).backward();
      else output.backward(gradients_[k]);
    }
    StepSample sample;
    sample.seconds = sample.pipeline_seconds = sample.compute_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    zero_grads(stage_.parameters);
    return sample;
  }

 private:
  gpt::Gpt model_;
  pp::PipelineStage stage_;
  int rank_, ranks_, microbatches_;
  std::vector<at::Tensor> activations_, gradients_;
};

std::string fixed(double value, int decimals) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// A double reduced over the ranks (sum or max), on every rank.
double all_reduce(const dtensor::MeshPtr& mesh, double value, c10d::ReduceOp op) {
  std::vector<at::Tensor> t = {at::full({1}, value, at::kDouble)};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  mesh->group(0)->allreduce(t, options)->wait();
  return t[0].item<double>();
}

// Per contender and step: the step time (max over ranks), the bubble (mean over ranks of the idle share
// of that step), the activation peak (max over ranks) and the loss.
struct Measured {
  std::vector<double> step_ms, bubble, activation_mib, losses;
};

Measured measure(const dtensor::MeshPtr& mesh, Contender& contender, const gpt::Batch& batch) {
  mesh->group(0)->barrier()->wait();
  const StepSample s = contender.step(batch);
  Measured m;
  const double step = all_reduce(mesh, s.seconds, c10d::ReduceOp::MAX);
  // The bubble is the schedule's: the optimizer step after it is no pipeline idle time.
  const double pipeline = all_reduce(mesh, s.pipeline_seconds, c10d::ReduceOp::MAX);
  const double idle = all_reduce(mesh, (pipeline - s.compute_seconds) / pipeline, c10d::ReduceOp::SUM) / static_cast<double>(mesh->size(0));
  m.step_ms = {step * 1e3};
  m.bubble = {idle};
  m.activation_mib = {all_reduce(mesh, static_cast<double>(s.activation_bytes), c10d::ReduceOp::MAX) / (1 << 20)};
  m.losses = {all_reduce(mesh, s.loss, c10d::ReduceOp::SUM)};
  return m;
}

void append(Measured& into, const Measured& m) {
  for (auto [to, from] : {std::pair{&into.step_ms, &m.step_ms}, {&into.bubble, &m.bubble}, {&into.activation_mib, &m.activation_mib}, {&into.losses, &m.losses}})
    to->insert(to->end(), from->begin(), from->end());
}

int run(const std::shared_ptr<dtensor::World>& world, const Args& args) {
  at::set_num_threads(1);
  counting_allocator();
  const gpt::Corpus corpus = gpt::load_corpus(dtensor::build_paths::gpt_corpus);
  const gpt::Config config = config_of(args.config, corpus);
  const auto mesh = dtensor::DeviceMesh::create(world, {world->size()}, {.dim_names = {"pp"}});
  const int p = args.ranks, m = args.microbatches;
  const bool root = world->rank() == 0;

  const double one_per_rank = static_cast<double>(p - 1) / (m + p - 1), two_per_rank = static_cast<double>(p - 1) / (2 * m + p - 1);
  std::vector<Contender> contenders = {
      dtensor_contender("GPipe", pp::gpipe(p, m), config, mesh, one_per_rank),
      dtensor_contender("1F1B", pp::one_f_one_b(p, m), config, mesh, one_per_rank),
      dtensor_contender("Interleaved 1F1B", pp::interleaved_1f1b(p, 2, m), config, mesh, two_per_rank),
      dtensor_contender("ZBV zero bubble", pp::zbv_zero_bubble(p, m), config, mesh, -1),
  };
  if (m >= 2 * p) contenders.push_back(dtensor_contender("DualPipeV", pp::dual_pipe_v(p, m), config, mesh, -1));  // its least microbatches
  auto hand = std::make_shared<HandWritten1F1B>(config, mesh, m);
  contenders.push_back({"hand-written over c10d", "1F1B", p, one_per_rank, [hand](const gpt::Batch& b) { return hand->step(b); }});
  const size_t hand_index = contenders.size() - 1;
  auto floor = std::make_shared<ComputeFloor>(config, mesh, m);
  contenders.push_back({"compute floor", "forwards and backwards alone", p, -1, [floor](const gpt::Batch& b) { return floor->step(b); }, false});

  gpt::Batches stream(corpus, m * kMicrobatchSize, config.seq_len, kSeed);
  std::vector<gpt::Batch> batches;
  for (int i = 0; i < 4; ++i) batches.push_back(stream.next());
  std::vector<Measured> results(contenders.size());
  std::vector<double> first_losses;
  for (int s = 0; s < kWarmupSteps; ++s)
    for (Contender& c : contenders) {
      const Measured w = measure(mesh, c, batches[s % batches.size()]);
      if (s == 0 && c.trains) first_losses.push_back(w.losses[0]);
    }
  for (double loss : first_losses)
    if (std::abs(loss - first_losses[0]) > kLossTolerance * std::abs(first_losses[0]))
      throw std::runtime_error("the implementations' first losses differ: " + std::to_string(loss) + " vs " + std::to_string(first_losses[0]));

  std::vector<double> ratios;  // dtensor 1F1B over hand-written 1F1B, per round (medians of the round's steps)
  for (int round = 0; round < args.rounds; ++round) {
    std::vector<double> round_1f1b, round_hand;
    for (size_t k = 0; k < contenders.size(); ++k) {
      const size_t c = (k + static_cast<size_t>(round)) % contenders.size();  // who goes first rotates
      for (int s = 0; s < kStepsPerRound; ++s) {
        const Measured one = measure(mesh, contenders[c], batches[s % batches.size()]);
        append(results[c], one);
        if (c == 1) round_1f1b.push_back(one.step_ms[0]);
        if (c == hand_index) round_hand.push_back(one.step_ms[0]);
      }
    }
    ratios.push_back(bench::quantile(round_1f1b, 0.5) / bench::quantile(round_hand, 0.5));
  }
  if (!root) return 0;
  const std::string run = args.config + ", " + dtensor::to_string(mesh->backend());
  std::printf("First-step loss (%s; every implementation from the same seed and batch): %.7f, all within %.0e\n", run.c_str(), first_losses[0],
              kLossTolerance);

  for (size_t c = 0; c < contenders.size(); ++c) {
    const Measured& r = results[c];
    const std::string theory = contenders[c].theory_bubble < 0 ? "-" : std::to_string(contenders[c].theory_bubble).substr(0, 5);
    const bool trains = contenders[c].trains;
    std::printf("| %s | %s | %s | %s | %d | %.2f | %.2f-%.2f | %s | %s | %s |\n", args.config.c_str(), dtensor::to_string(mesh->backend()).c_str(), contenders[c].name.c_str(), contenders[c].schedule.c_str(), contenders[c].stages,
                bench::quantile(r.step_ms, 0.5), bench::quantile(r.step_ms, 0.25), bench::quantile(r.step_ms, 0.75),
                trains ? fixed(bench::quantile(r.bubble, 0.5), 3).c_str() : "-", theory.c_str(), trains ? fixed(bench::quantile(r.activation_mib, 0.5), 2).c_str() : "-");
  }
  std::printf("Ratio (%s) dtensor 1F1B / hand-written 1F1B within each round (paired): %s\n", run.c_str(), bench::ratio_summary(ratios).c_str());
  std::printf("Peak activations (%s), 1F1B over GPipe: %.3f (p/m = %.3f)\n", run.c_str(),
              bench::quantile(results[1].activation_mib, 0.5) / bench::quantile(results[0].activation_mib, 0.5), static_cast<double>(p) / m);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return dtensor::run_local_ranks(argc, argv, dtensor::LaunchOptions{.nprocs = args.ranks},
                                  [&](const std::shared_ptr<dtensor::World>& world) { return run(world, args); });
}
