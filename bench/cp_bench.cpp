// Context-parallel attention's step time: causal attention forward and backward (batch 1, 8 query heads,
// 4 key/value heads, head dim 32, float) on a sequence sharded head-tail over N ranks, by ring and by
// all-to-all, against one process holding the whole sequence and using every core of the machine (rank
// 0 alone, with one intra-op thread per core, while the other ranks sleep on the store). Every CP rank
// has one intra-op thread. Rank 0 prints Markdown rows; bench/cp.sh (./dev bench cp) runs N = 2, 4.
//
//   dtensor_cp_bench [--ranks N] [--seqs 4096,8192] [--rounds R]
//
// A step is q, k and v made leaves, attention, and its backward from a fixed output gradient, after a
// barrier; its time is the slowest rank's. Its communication is what the ranks spent blocked in
// dtensor's communication (CommunicationTime: posting transfers, waiting for them, collectives), over
// the step time, averaged over the ranks: the share overlap did not hide. Each round runs the one
// process's step, then the ring's and the all-to-all's in turn, which goes first alternating. Before
// timing, each method's output and query gradient must match the one process's (rank 0 compares the
// gathered sequence).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "flags.h"
#include "ratio_summary.h"
#include "dtensor/comm_debug.h"
#include "dtensor/context_parallel.h"
#include "dtensor/dtensor.h"
#include "dtensor/sharding.h"

namespace {

using dtensor::ContextParallelAttention;
constexpr int64_t kCpQueryHeads = 8, kCpKvHeads = 4, kCpHeadDim = 32;
constexpr double kMatchTolerance = 1e-4;  // largest difference from the one process, relative to its largest value

struct Args {
  int ranks = 2;
  std::vector<int64_t> seqs{4096, 8192};
  int rounds = 3;
};

Args parse(int argc, char** argv) {
  const bench::Flags flags(argc, argv, {"--ranks", "--seqs", "--rounds"});
  Args args;
  args.ranks = flags.number("--ranks", args.ranks);
  args.rounds = flags.number("--rounds", args.rounds);
  std::stringstream seqs(flags.text("--seqs", "4096,8192"));
  args.seqs.clear();
  for (std::string s; std::getline(seqs, s, ',');) args.seqs.push_back(std::stoll(s));
  if (args.ranks < 2 || args.rounds < 1 || args.seqs.empty())
    throw std::invalid_argument("--ranks N >= 2, --rounds R >= 1, --seqs L,L,... (multiples of 2N)");
  return args;
}

// The whole sequence's tensors, the same on every rank.
struct Inputs {
  at::Tensor q, k, v, grad;
};

Inputs whole_inputs(int64_t seq) {
  at::manual_seed(1234);
  auto heads = [&](int64_t h) { return at::randn({1, h, seq, kCpHeadDim}); };
  return {heads(kCpQueryHeads), heads(kCpKvHeads), heads(kCpKvHeads), heads(kCpQueryHeads)};
}

struct StepResult {
  at::Tensor out, grad_q;  // this rank's
  double seconds = 0, communication_seconds = 0;
};

StepResult attention_step(const Inputs& in, const std::function<at::Tensor(const at::Tensor&)>& as_input) {
  const dtensor::CommunicationTime communication;
  const auto start = std::chrono::steady_clock::now();
  const at::Tensor q = as_input(in.q).requires_grad_(true), k = as_input(in.k).requires_grad_(true), v = as_input(in.v).requires_grad_(true);
  const at::Tensor out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt, /*enable_gqa=*/true);
  out.backward(as_input(in.grad));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {out.detach(), q.grad(), seconds, communication.seconds()};
}

class Bench {
 public:
  Bench(const std::shared_ptr<dtensor::World>& world, const Args& args)
      : world_(world), args_(args), cp_(dtensor::DeviceMesh::create(world, {args.ranks}, {.dim_names = {"cp"}})) {}

  void run() {
    dtensor::set_context_parallel_load_balance(true);
    if (rank() == 0) {
      std::printf("Backend: %s (ranks started by %s)\n\n", dtensor::to_string(cp_->backend()).c_str(), world_->launcher().c_str());
      std::printf("| positions | CP | method | step ms | middle half | step / one process | communication share |\n");
      std::printf("| --: | --- | --- | --: | --: | --: | --: |\n");
    }
    for (const int64_t seq : args_.seqs) run_length(seq);
    dtensor::set_context_parallel_load_balance(false);
    if (rank() == 0) std::printf("\nRing / all-to-all, step time within each round (paired):\n%s", ratio_lines_.c_str());
  }

 private:
  int64_t rank() const { return world_->rank(); }

  // The one process on rank 0 with every core; the other ranks wait on the store without taking one.
  StepResult solo_step(const Inputs& whole, int round) {
    barrier();
    const std::string done = "cp bench solo " + std::to_string(whole.q.size(2)) + "/" + std::to_string(round);
    if (rank() != 0) {
      world_->store()->wait({done});
      return {};
    }
    at::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
    StepResult r = attention_step(whole, [](const at::Tensor& t) { return t.clone(); });
    at::set_num_threads(1);
    world_->store()->set(done, std::vector<uint8_t>{1});
    return r;
  }

  StepResult cp_step(const Inputs& whole, ContextParallelAttention method) {
    dtensor::set_context_parallel_attention(method);
    barrier();
    return attention_step(whole, [&](const at::Tensor& t) {
      return dtensor::from_local(dtensor::context_parallel_shard(t, *cp_, 2), cp_, {dtensor::Shard(2)}, {.run_check = false});
    });
  }

  // The whole sequence of a rank's head-tail block on rank 0, next to the one process's.
  void check_matches(const StepResult& solo, const StepResult& parallel, const char* method) {
    for (const auto& [mine, whole, what] : {std::tuple{parallel.out, solo.out, "output"}, std::tuple{parallel.grad_q, solo.grad_q, "query gradient"}}) {
      const at::Tensor gathered = dtensor::context_parallel_unshard(dtensor::to_local(mine), cp_, 2);
      if (rank() != 0) continue;
      const double difference = (gathered - whole).abs().max().item<double>() / whole.abs().max().item<double>();
      if (difference > kMatchTolerance)
        throw std::runtime_error(std::string(method) + "'s " + what + " differs from the one process's by " + std::to_string(difference) +
                                 " (relative); not timing");
    }
  }

  void run_length(int64_t seq) {
    const Inputs whole = whole_inputs(seq);
    const char* names[] = {"ring", "all-to-all"};
    const ContextParallelAttention methods[] = {ContextParallelAttention::Ring, ContextParallelAttention::AllToAll};
    const StepResult solo = solo_step(whole, -1);  // warm-up, and the reference
    for (int m = 0; m < 2; ++m) check_matches(solo, cp_step(whole, methods[m]), names[m]);
    // [round][one process, ring, all-to-all][step seconds, communication seconds]
    at::Tensor times = at::zeros({args_.rounds, 3, 2}, at::kDouble);
    at::Tensor communication = at::zeros({args_.rounds, 3}, at::kDouble);
    for (int round = 0; round < args_.rounds; ++round) {
      times[round][0][0] = solo_step(whole, round).seconds;
      for (int i = 0; i < 2; ++i) {
        const int m = (round + i) % 2;
        const StepResult r = cp_step(whole, methods[m]);
        times[round][1 + m][0] = r.seconds;
        communication[round][1 + m] = r.communication_seconds;
      }
    }
    reduce(times, c10d::ReduceOp::MAX);
    reduce(communication, c10d::ReduceOp::SUM);
    if (rank() != 0) return;
    const at::Tensor step_ms = times.select(2, 0) * 1e3;
    const at::Tensor share = communication / static_cast<double>(args_.ranks) / times.select(2, 0);
    const double solo_ms = step_ms.select(1, 0).median().item<double>();
    const std::string cp = "CP=" + std::to_string(args_.ranks);
    print_row(seq, "1", "one process, " + std::to_string(std::thread::hardware_concurrency()) + " threads", step_ms.select(1, 0), solo_ms, "");
    for (int m = 0; m < 2; ++m) {
      char text[32];
      std::snprintf(text, sizeof text, "%.0f%%", 100 * share.select(1, 1 + m).median().item<double>());
      print_row(seq, cp, std::string("dtensor ") + names[m], step_ms.select(1, 1 + m), solo_ms, text);
    }
    std::vector<double> ring_over_all_to_all;
    for (int round = 0; round < args_.rounds; ++round)
      ring_over_all_to_all.push_back(step_ms[round][1].item<double>() / step_ms[round][2].item<double>());
    ratio_lines_ += "- " + std::to_string(seq) + " positions, " + cp + ": " +
                    bench::ratio_summary(ring_over_all_to_all) + "\n";
  }

  static void print_row(int64_t seq, const std::string& cp, const std::string& method, const at::Tensor& ms, double solo_ms,
                        const std::string& share) {
    const double median = ms.median().item<double>();
    const at::Tensor dense = ms.contiguous();
    std::vector<double> values(dense.data_ptr<double>(), dense.data_ptr<double>() + dense.numel());
    std::printf("| %lld | %s | %s | %.1f | %.1f-%.1f | %.2f | %s |\n", static_cast<long long>(seq), cp.c_str(), method.c_str(), median,
                bench::quantile(values, 0.25), bench::quantile(values, 0.75), median / solo_ms, share.c_str());
  }

  void barrier() { cp_->group(0)->barrier()->wait(); }

  void reduce(at::Tensor& t, c10d::ReduceOp op) {
    std::vector<at::Tensor> tensors{t};
    cp_->group(0)->allreduce(tensors, c10d::AllreduceOptions{.reduceOp = op})->wait();
  }

  std::shared_ptr<dtensor::World> world_;
  Args args_;
  dtensor::MeshPtr cp_;
  std::string ratio_lines_;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return dtensor::run_local_ranks(argc, argv, dtensor::LaunchOptions{.nprocs = args.ranks}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);
    Bench(world, args).run();
    return 0;
  });
}
