// Forward time of the GPT demo model under tensor parallelism, three ways in the same processes:
// graph-level TP (the model exported from Python, transformed per rank by dtensor::graph, run by its
// interpreter), eager module-level TP (gpt::parallelize, DTensor dispatch per op), and hand-written
// Megatron (bench/megatron_gpt.h, raw c10d). Each computes the whole logits [batch, seq, vocab] on
// every rank from the same weights (the exported program's), checked equal before timing.
// Rank 0 prints a markdown table; bench/graph.sh (./dev bench graph) runs TP = 2 and 4.
//
//   dtensor_graph_bench --model PATH [--tp N] [--rounds R]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "dtensor/dtensor.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/tensor_parallel.h"
#include "gpt/graph_plan.h"
#include "gpt/training.h"
#include "megatron_gpt.h"

namespace {

namespace g = dtensor::graph;
using Clock = std::chrono::steady_clock;

constexpr int kWarmup = 3;
constexpr int kStepsPerRound = 5;

struct Args {
  std::string model;
  int tp = 2;
  int rounds = 20;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") args.model = value;
    else if (flag == "--tp") args.tp = std::stoi(value);
    else if (flag == "--rounds") args.rounds = std::stoi(value);
    else throw std::invalid_argument("unknown flag " + flag + " (use --model, --tp, --rounds)");
  }
  if (args.model.empty()) throw std::invalid_argument("--model PATH (the exported GPT, gpt_train_ir_static.pt2) is required");
  return args;
}

// The C++ GPT with the exported program's weights (the same names on both sides).
gpt::Gpt model_from(const g::Program& program, const gpt::Config& config) {
  gpt::Gpt model(config);
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) p.value().copy_(program.state.at(p.key()).tensor());
  for (auto& b : model->named_buffers()) b.value().copy_(program.state.at(b.key()).tensor());
  return model;
}

struct Contender {
  std::string name;
  std::function<at::Tensor(const at::Tensor&)> logits;
  std::vector<double> ms;
};

double max_over_ranks(double v) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  megatron::tp_group().backend->allreduce(ts, o)->wait();
  return t.item<double>();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const std::shared_ptr<dtensor::World>& world, const Args& args) {
  at::set_num_threads(1);
  torch::NoGradGuard no_grad;
  auto mesh = dtensor::DeviceMesh::create(world, {world->size()}, {.dim_names = {"tp"}});
  megatron::tp_group() = {mesh->group(0), world->rank(), world->size()};
  const gpt::Config config = gpt::demo_config(gpt::load_corpus(GPT_CORPUS_PATH));

  // Graph: the plan of examples/gpt/training.h by module path, the LM head's classes gathered at the end.
  const dtensor::ParallelizePlan plan = gpt::graph_plan();
  g::Program whole = g::load_program(args.model);
  g::Program local = g::tensor_parallel_transform(g::load_program(args.model), mesh, plan);
  gpt::Gpt eager = model_from(whole, config);
  gpt::parallelize(eager, mesh);
  const megatron::MegatronGpt hand(model_from(whole, config), config);

  std::vector<Contender> contenders;
  contenders.push_back({"graph TP (dtensor::graph)", [&](const at::Tensor& t) { return g::run(local, {t})[0].toTensor(); }});
  contenders.push_back({"eager module-level TP (dtensor)", [&](const at::Tensor& t) {
                          at::Tensor logits = eager->logits(t);
                          return dtensor::is_dtensor(logits) ? dtensor::full_tensor(logits) : logits;
                        }});
  contenders.push_back({"hand-written Megatron (raw c10d)", [&](const at::Tensor& t) { return hand.logits(t); }});

  const at::Tensor tokens = at::arange(8 * config.seq_len, at::kLong).mul(7).remainder(config.vocab).view({8, config.seq_len});
  const at::Tensor expected = g::run(whole, {tokens})[0].toTensor();
  for (auto& c : contenders)
    if (!at::allclose(c.logits(tokens), expected, 1e-4, 1e-5))
      throw std::runtime_error(c.name + ": logits differ from the single-process program's");

  for (auto& c : contenders)
    for (int i = 0; i < kWarmup; ++i) c.logits(tokens);
  for (int round = 0; round < args.rounds; ++round)
    for (size_t k = 0; k < contenders.size(); ++k) {
      Contender& c = contenders[(k + round) % contenders.size()];  // rotate the order
      for (int s = 0; s < kStepsPerRound; ++s) {
        megatron::tp_group().backend->barrier()->wait();
        const auto start = Clock::now();
        c.logits(tokens);
        c.ms.push_back(max_over_ranks(std::chrono::duration<double, std::milli>(Clock::now() - start).count()));
      }
    }
  if (world->rank() == 0) {
    const double base = median(contenders.back().ms);
    std::printf("| implementation | forward (median, ms) | vs hand-written |\n|---|--:|--:|\n");
    for (const auto& c : contenders) std::printf("| %s | %.2f | %.2f |\n", c.name.c_str(), median(c.ms), median(c.ms) / base);
    std::printf("\nCollectives per forward, graph TP: ");
    std::map<std::string, int> count;
    for (const g::Node* n : local.graph.nodes())
      if (n->target.find("_c10d_functional") != std::string::npos && n->target.find("wait_tensor") == std::string::npos)
        ++count[n->op_name()];
    for (const auto& [op, n] : count) std::printf("%d %s; ", n, op.c_str());
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return dtensor::run_local_ranks(argc, argv, {.nprocs = args.tp}, [&](const std::shared_ptr<dtensor::World>& world) {
    return run(world, args);
  });
}
