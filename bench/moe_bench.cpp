// The MoE layer's training step under expert parallelism (dtensor::MoE with expert_parallel over EP=N,
// each rank its own tokens) against:
//  - a hand-written all-to-all MoE over raw c10d (the same routing and grouped matrix multiply, the
//    all-to-alls posted on the process group directly: what the layer's own overhead is measured by);
//  - tensor parallelism of the same experts (every rank all experts with 1/N of each one's features,
//    the tokens all-gathered and the outputs reduce-scattered);
//  - one process holding every token and expert (rank 0 alone with one intra-op thread per core while
//    the other ranks wait on the store).
// And the bytes EP's all-to-alls carry against the least the routing needs (each token sent once to
// each other rank holding one of its experts, and back). Rank 0 prints Markdown; bench/moe.sh (./dev
// bench moe) runs it on the MPI backend and on Gloo.
//
//   dtensor_moe_bench [--ranks N] [--tokens T] [--rounds R]
//
// A step is forward and backward of the layer on the rank's T tokens from a fixed output gradient, after
// a barrier; its time is the slowest rank's. Every round runs the four in turn (which of the three
// parallel ones goes first rotating). Before timing, every method's output must match dtensor's
// (relative 1e-4).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dtensor/dtensor.h"
#include "dtensor/moe.h"
#include "flags.h"
#include "ratio_summary.h"

namespace {

constexpr int64_t kHidden = 256, kIntermediate = 512, kExperts = 8, kTopK = 2;  // the byte count assumes top 2
constexpr double kMatchTolerance = 1e-4;

struct Args {
  int ranks = 4;
  int64_t tokens = 1024;
  int rounds = 10;
};

Args parse(int argc, char** argv) {
  const bench::Flags flags(argc, argv, {"--ranks", "--tokens", "--rounds"});
  Args args{flags.number("--ranks", 4), flags.number("--tokens", 1024), flags.number("--rounds", 10)};
  if (args.ranks < 2 || kExperts % args.ranks != 0 || args.tokens < 1 || args.rounds < 1)
    throw std::invalid_argument("--ranks N >= 2 dividing 8 experts, --tokens T >= 1, --rounds R >= 1");
  return args;
}

dtensor::MoEOptions layer_options(int64_t intermediate) {
  dtensor::MoEOptions o;
  o.hidden = kHidden;
  o.intermediate = intermediate;
  o.experts = kExperts;
  o.top_k = kTopK;
  o.normalize_top_k = true;
  return o;
}

// The whole layer's weights, the same on every rank.
struct Weights {
  at::Tensor gate, gate_up, down;
};

Weights whole_weights() {
  at::manual_seed(99);
  return {at::randn({kExperts, kHidden}) * 0.1, at::randn({kExperts, 2 * kIntermediate, kHidden}) * 0.05,
          at::randn({kExperts, kHidden, kIntermediate}) * 0.05};
}

dtensor::MoE layer_with(const Weights& w, int64_t intermediate_from, int64_t intermediate) {
  dtensor::MoE moe(layer_options(intermediate));
  at::NoGradGuard no_grad;
  moe->gate->weight.copy_(w.gate);
  moe->experts->gate_up_proj.copy_(at::cat({w.gate_up.narrow(1, intermediate_from, intermediate),
                                            w.gate_up.narrow(1, kIntermediate + intermediate_from, intermediate)},
                                           1));
  moe->experts->down_proj.copy_(w.down.narrow(2, intermediate_from, intermediate));
  return moe;
}

// Rank r's tokens and output gradient.
std::pair<at::Tensor, at::Tensor> tokens_of(int64_t rank, int64_t tokens) {
  at::manual_seed(1000 + static_cast<uint64_t>(rank));
  return {at::randn({tokens, kHidden}), at::randn({tokens, kHidden})};
}

// The hand-written baseline's all-to-all: c10d's, posted on the group directly, its backward the same
// exchange reversed.
struct RawAllToAll : torch::autograd::Function<RawAllToAll> {
  static at::Tensor exchange(c10d::Backend& group, const at::Tensor& rows, std::vector<int64_t> send, std::vector<int64_t> receive) {
    int64_t total = 0;
    for (const int64_t r : receive) total += r;
    at::Tensor in = rows.contiguous(), out = at::empty({total, rows.size(1)}, rows.options());
    group.alltoall_base(out, in, receive, send)->wait();
    return out;
  }
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& rows, c10d::Backend* group,
                            std::vector<int64_t> send, std::vector<int64_t> receive) {
    ctx->saved_data["send"] = send;
    ctx->saved_data["receive"] = receive;
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return exchange(*group, rows, send, receive);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<c10d::Backend*>(ctx->saved_data["group"].toInt());
    return {exchange(*group, grads[0], ctx->saved_data["receive"].toIntVector(), ctx->saved_data["send"].toIntVector()), {}, {}, {}};
  }
};

std::vector<int64_t> values_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// What a user writes by hand (torchtitan's token dispatch): softmax top-k routing, tokens sorted by
// expert, counts exchanged, rows sent, regrouped by local expert, grouped matrix multiply, and back.
at::Tensor hand_written_moe(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& gate_up, const at::Tensor& down,
                            c10d::Backend& group, int64_t ranks) {
  const int64_t local = kExperts / ranks;
  auto [weights, chosen] = at::topk(at::softmax(at::linear(x, gate), -1), kTopK, -1);
  weights = weights / weights.sum(-1, true);
  const at::Tensor order = at::argsort(chosen.reshape(-1), /*stable=*/true);
  const at::Tensor token = at::div(order, kTopK, "floor");
  const at::Tensor counts = at::bincount(chosen.reshape(-1), {}, kExperts);
  at::Tensor received = at::empty_like(counts);
  at::Tensor counts_in = counts.clone();
  std::vector<int64_t> each(ranks, local);
  group.alltoall_base(received, counts_in, each, each)->wait();
  const at::Tensor from = received.reshape({ranks, local});
  const std::vector<int64_t> send = values_of(counts.reshape({ranks, local}).sum(1)), receive = values_of(from.sum(1));
  const at::Tensor arrived = RawAllToAll::apply(x.index_select(0, token), &group, send, receive);
  // Arrived in (rank, expert) blocks; the grouped multiply wants (expert, rank) blocks.
  const at::Tensor block = at::arange(ranks * local).reshape({ranks, local}).t().reshape(-1);
  const at::Tensor per_row = at::repeat_interleave(at::arange(ranks * local), from.reshape(-1));
  const at::Tensor regroup = at::argsort(block.argsort().index_select(0, per_row), /*stable=*/true);
  const at::Tensor offsets = from.sum(0).cumsum(0).to(at::kInt);
  const at::Tensor h = at::_grouped_mm(arrived.index_select(0, regroup), gate_up.transpose(-2, -1), offsets);
  const auto halves = h.chunk(2, -1);
  const at::Tensor y = at::_grouped_mm(at::silu(halves[0]) * halves[1], down.transpose(-2, -1), offsets);
  const at::Tensor back = RawAllToAll::apply(y.index_select(0, regroup.argsort()), &group, receive, send);
  return at::zeros_like(x).index_add(0, token, back * weights.reshape(-1).index_select(0, order).unsqueeze(1));
}

struct Step {
  at::Tensor out;
  double seconds = 0;
};

Step timed(const std::function<at::Tensor(const at::Tensor&)>& layer, const at::Tensor& x, const at::Tensor& grad) {
  const auto start = std::chrono::steady_clock::now();
  const at::Tensor input = x.clone().requires_grad_();
  const at::Tensor out = layer(input);
  out.backward(grad);
  return {out.detach(), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

class Bench {
 public:
  Bench(const std::shared_ptr<dtensor::World>& world, const Args& args)
      : world_(world), args_(args), ep_(dtensor::DeviceMesh::create(world, {args.ranks}, {.dim_names = {"ep"}})) {
    const Weights w = whole_weights();
    ep_layer_ = layer_with(w, 0, kIntermediate);
    dtensor::expert_parallel(*ep_layer_, ep_, 0);
    const int64_t local = kExperts / args.ranks, me = rank();
    hand_ = {w.gate.clone().requires_grad_(), w.gate_up.narrow(0, me * local, local).clone().requires_grad_(),
             w.down.narrow(0, me * local, local).clone().requires_grad_()};
    const int64_t slice = kIntermediate / args.ranks;
    tp_layer_ = layer_with(w, me * slice, slice);
    if (me == 0) solo_layer_ = layer_with(w, 0, kIntermediate);
    std::tie(x_, grad_) = tokens_of(me, args.tokens);
  }

  void run() {
    check_and_count_bytes();
    at::Tensor times = at::zeros({args_.rounds, 4}, at::kDouble);  // dtensor, hand-written, TP, one process
    for (int round = 0; round < args_.rounds; ++round) {
      for (int i = 0; i < 3; ++i) {
        const int m = (round + i) % 3;
        barrier();
        times[round][m] = timed(method(m), x_, grad_).seconds;
      }
      times[round][3] = solo_step(round);
    }
    std::vector<at::Tensor> all{times};
    ep_->group(0)->allreduce(all, c10d::AllreduceOptions{.reduceOp = c10d::ReduceOp::MAX})->wait();
    if (rank() == 0) print(times * 1e3);
  }

 private:
  int64_t rank() const { return world_->rank(); }
  void barrier() { ep_->group(0)->barrier()->wait(); }

  std::function<at::Tensor(const at::Tensor&)> method(int m) {
    if (m == 0) return [this](const at::Tensor& x) { return ep_layer_->forward(x); };
    if (m == 1) return [this](const at::Tensor& x) { return hand_written_moe(x, hand_.gate, hand_.gate_up, hand_.down, *ep_->group(0), args_.ranks); };
    return [this](const at::Tensor& x) {
      // Every token to every rank, each rank's share of every expert's features, the sums back to the tokens' ranks.
      const at::Tensor all_tokens = dtensor::full_tensor(dtensor::from_local(x, ep_, {dtensor::Shard(0)}));
      const at::Tensor partial = dtensor::from_local(tp_layer_->forward(all_tokens), ep_, {dtensor::Partial()});
      return dtensor::to_local(dtensor::redistribute(partial, {dtensor::Shard(0)}));
    };
  }

  // Rank 0 runs every rank's tokens through the whole layer with every core; the others wait.
  double solo_step(int round) {
    barrier();
    const std::string done = "moe bench solo " + std::to_string(round);
    if (rank() != 0) {
      world_->store()->wait({done});
      return 0;
    }
    std::vector<at::Tensor> xs, grads;
    for (int64_t r = 0; r < args_.ranks; ++r) {
      auto [x, g] = tokens_of(r, args_.tokens);
      xs.push_back(x);
      grads.push_back(g);
    }
    at::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
    const double seconds = timed([this](const at::Tensor& x) { return solo_layer_->forward(x); }, at::cat(xs), at::cat(grads)).seconds;
    at::set_num_threads(1);
    world_->store()->set(done, std::vector<uint8_t>{1});
    return seconds;
  }

  // Every method's output against dtensor's; the bytes EP sends other ranks against the least.
  void check_and_count_bytes() {
    const at::Tensor reference = timed(method(0), x_, grad_).out;
    for (int m = 1; m < 3; ++m) {
      const at::Tensor out = timed(method(m), x_, grad_).out;
      const double difference = (out - reference).abs().max().item<double>() / reference.abs().max().item<double>();
      if (difference > kMatchTolerance)
        throw std::runtime_error("method " + std::to_string(m) + " differs from dtensor's by " + std::to_string(difference));
    }
    const dtensor::Routing routing = ep_layer_->gate->forward(x_);
    const at::Tensor owner = at::div(routing.experts, kExperts / args_.ranks, "floor");  // [tokens, k]
    const at::Tensor remote = owner.ne(rank());
    // Rows sent per assignment vs. once per (token, other rank): both ways, forward and backward alike.
    const at::Tensor first_of_rank = remote & (owner.select(1, 0) != owner.select(1, 1)).unsqueeze(1).logical_or(at::arange(kTopK).eq(0));
    at::Tensor counts = at::tensor({remote.sum().item<double>(), first_of_rank.sum().item<double>()}, at::kDouble);
    std::vector<at::Tensor> both{counts};
    ep_->group(0)->allreduce(both)->wait();
    sent_rows_ = counts[0].item<double>();
    least_rows_ = counts[1].item<double>();
  }

  void print(const at::Tensor& ms) {
    const char* names[] = {"dtensor MoE, EP", "hand-written all-to-all MoE over raw c10d, EP", "tensor parallel experts (TP)",
                           "one process"};
    std::printf("Backend: %s (ranks started by %s)\n\n", dtensor::to_string(ep_->backend()).c_str(), world_->launcher().c_str());
    std::printf("| method | ranks | step ms | middle half | dtensor EP / method (paired) |\n| --- | --: | --: | --: | --- |\n");
    for (int m = 0; m < 4; ++m) {
      const at::Tensor column = ms.select(1, m).contiguous();
      std::vector<double> values(column.data_ptr<double>(), column.data_ptr<double>() + column.numel()), ratios;
      for (int r = 0; r < args_.rounds; ++r) ratios.push_back(ms[r][0].item<double>() / ms[r][m].item<double>());
      std::printf("| %s | %s | %.1f | %.1f-%.1f | %s |\n", names[m], m == 3 ? ("1, " + std::to_string(std::thread::hardware_concurrency()) + " threads").c_str() : std::to_string(args_.ranks).c_str(),
                  bench::quantile(values, 0.5), bench::quantile(values, 0.25), bench::quantile(values, 0.75),
                  m == 0 ? "" : bench::ratio_summary(ratios).c_str());
    }
    const double row_bytes = static_cast<double>(kHidden) * 4;
    std::printf("\nAll-to-all bytes per step to other ranks (dispatch and combine, forward and backward): %.2f MB; the least "
                "for this routing (each token once to each other rank holding one of its experts): %.2f MB; ratio %.3f\n",
                4 * sent_rows_ * row_bytes / 1e6, 4 * least_rows_ * row_bytes / 1e6, sent_rows_ / least_rows_);
  }

  std::shared_ptr<dtensor::World> world_;
  Args args_;
  dtensor::MeshPtr ep_;
  dtensor::MoE ep_layer_{nullptr}, tp_layer_{nullptr}, solo_layer_{nullptr};
  Weights hand_;
  at::Tensor x_, grad_;
  double sent_rows_ = 0, least_rows_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return dtensor::run_local_ranks(argc, argv, dtensor::LaunchOptions{.nprocs = args.ranks}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);  // one core per rank
    Bench(world, args).run();
    return 0;
  });
}
