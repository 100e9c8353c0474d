// The GPT demo model under tensor parallelism, three ways in the same processes: from the exported
// graph (dtensor::graph, run by its interpreter), eager module-level TP (gpt::parallelize, DTensor
// dispatch per op), and hand-written Megatron (bench/megatron_gpt.h, raw c10d). All from the same
// weights (the exported program's), checked against the single-process program before timing.
//  - forward (--model gpt_train_ir_static.pt2): the whole logits [batch, seq, vocab] on every rank;
//    the graph is tensor_parallel_transform's program.
//  - training step (--train, --model gpt_joint.pt2): loss, gradients and an AdamW step; the graph is
//    the joint forward+backward program expanded by spmd_expand from the plan's placements. Also the
//    expanded step's peak of live activation bytes, with and without freeing after the last use.
// Rank 0 prints markdown; bench/graph.sh (./dev bench graph) runs TP = 2 and 4.
//
// With --save-programs DIR each rank saves its program (the TP forward, or the expanded joint step)
// with its sample inputs to DIR/rank<r>.pt2 and stops; bench/graph.sh compiles them with AOTInductor,
// and --compiled DIR times those packages (graph::CompiledProgram) next to the other three.
//
// With --saved DIR --names A,B,... (4 ranks) it times, instead, per-rank programs the graph tests saved
// (DIR/saved/tp_<name>_rank<r>.pt2 with sample inputs, tests/compiled/hf_rank_programs.sh: the Hugging Face
// models') compiled (DIR/compiled/) against dtensor's interpreter running the same program read back,
// both checked first against the interpreter's outputs at saving (tests/compiled/saved_rank_program.h).
//
//   dtensor_graph_bench --model PATH [--train] [--tp N] [--rounds R] [--save-programs DIR | --compiled DIR]
//   dtensor_graph_bench --saved DIR --names A,B,... [--rounds R]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../tests/compiled/saved_rank_program.h"
#include "build_paths.h"
#include "dtensor/dtensor.h"
#include "dtensor/graph/compiled_program.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/spmd.h"
#include "dtensor/graph/tensor_parallel.h"
#include "dtensor/graph/training.h"
#include "gpt/graph_plan.h"
#include "gpt/training.h"
#include "megatron_gpt.h"

namespace {

namespace g = dtensor::graph;
using Clock = std::chrono::steady_clock;

constexpr int kWarmup = 3;
constexpr int kStepsPerRound = 5;
constexpr double kLearningRate = 1e-3;

struct Args {
  std::string model;
  std::string save_programs;  // forward: save each rank's program with sample inputs here, then stop
  std::string compiled;       // forward: also time the packages compiled from them (scripts/compile_rank_programs.py)
  std::string saved;          // saved programs and their packages (DIR/saved, DIR/compiled) ...
  std::vector<std::string> names;  // ... of these names, timed compiled against interpreted
  bool train = false;
  int tp = 2;
  int rounds = 20;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--train") {
      args.train = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model") args.model = value;
    else if (flag == "--tp") args.tp = std::stoi(value);
    else if (flag == "--rounds") args.rounds = std::stoi(value);
    else if (flag == "--save-programs") args.save_programs = value;
    else if (flag == "--compiled") args.compiled = value;
    else if (flag == "--saved") args.saved = value;
    else if (flag == "--names")
      for (size_t at = 0; at <= value.size();) {
        const size_t comma = std::min(value.find(',', at), value.size());
        args.names.push_back(value.substr(at, comma - at));
        at = comma + 1;
      }
    else throw std::invalid_argument("unknown flag " + flag + " (use --model, --train, --tp, --rounds, --save-programs, --compiled, --saved, --names)");
  }
  if (!args.saved.empty()) {
    if (args.names.empty()) throw std::invalid_argument("--saved DIR needs --names A,B,...");
    args.tp = 4;  // the saved programs' mesh: 4 ranks
    return args;
  }
  if (args.model.empty()) throw std::invalid_argument("--model PATH (gpt_train_ir_static.pt2, or gpt_joint.pt2 with --train) is required");
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

// One implementation under test: `run` does one forward (or one training step).
struct Contender {
  std::string name;
  std::function<void()> run;
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

// Rounds of kStepsPerRound runs each, the order rotating, a barrier before every run; a run's time
// is the maximum over ranks.
void time_rounds(std::vector<Contender>& contenders, int rounds) {
  for (auto& c : contenders)
    for (int i = 0; i < kWarmup; ++i) c.run();
  for (int round = 0; round < rounds; ++round)
    for (size_t k = 0; k < contenders.size(); ++k) {
      Contender& c = contenders[(k + round) % contenders.size()];
      for (int s = 0; s < kStepsPerRound; ++s) {
        megatron::tp_group().backend->barrier()->wait();
        const auto start = Clock::now();
        c.run();
        c.ms.push_back(max_over_ranks(std::chrono::duration<double, std::milli>(Clock::now() - start).count()));
      }
    }
}

void print_table(const std::vector<Contender>& contenders, const char* what) {
  const double base = median(contenders.back().ms);  // hand-written, the last
  std::printf("| implementation | %s (median, ms) | vs hand-written |\n|---|--:|--:|\n", what);
  for (const auto& c : contenders) std::printf("| %s | %.2f | %.2f |\n", c.name.c_str(), median(c.ms), median(c.ms) / base);
}

void print_collectives(const g::Program& program, const char* what) {
  std::map<std::string, int> count;
  for (const g::CollectiveNote& c : g::collectives(program)) ++count[c.op.substr(c.op.find("::") + 2)];
  std::printf("\nCollectives per %s, graph: ", what);
  for (const auto& [op, n] : count) std::printf("%d %s; ", n, op.c_str());
  std::printf("\n");
}

at::Tensor demo_tokens(const gpt::Config& config, int64_t length) {
  return at::arange(8 * length, at::kLong).mul(7).remainder(config.vocab).view({8, length});
}

std::string rank_program_path(const std::string& dir, const dtensor::DeviceMesh& mesh) {
  return dir + "/rank" + std::to_string(mesh.world()->rank()) + ".pt2";
}

void save_rank_program(const g::Program& program, const dtensor::DeviceMesh& mesh, const std::string& dir,
                       const std::vector<c10::IValue>& sample_inputs) {
  std::filesystem::create_directories(dir);
  g::save_program(program, rank_program_path(dir, mesh), {.sample_inputs = sample_inputs});
}

int run_forward(const dtensor::MeshPtr& mesh, const gpt::Config& config, const Args& args) {
  torch::NoGradGuard no_grad;
  g::Program whole = g::load_program(args.model);
  g::Program local = g::tensor_parallel_transform(g::load_program(args.model), mesh, gpt::graph_plan());
  gpt::Gpt eager = model_from(whole, config);
  gpt::parallelize(eager, mesh);
  const megatron::MegatronGpt hand(model_from(whole, config), config);

  const at::Tensor tokens = demo_tokens(config, config.seq_len);
  if (!args.save_programs.empty()) {
    save_rank_program(local, *mesh, args.save_programs, {tokens});
    return 0;
  }
  std::vector<std::pair<std::string, std::function<at::Tensor()>>> logits;
  std::unique_ptr<g::CompiledProgram> compiled;
  if (!args.compiled.empty()) {
    compiled = std::make_unique<g::CompiledProgram>(rank_program_path(args.compiled, *mesh), mesh);
    logits.push_back({"compiled graph TP (AOTInductor)", [&] { return compiled->run({tokens})[0]; }});
  }
  logits.insert(logits.end(), {
      {"graph TP (dtensor::graph)", [&] { return g::run(local, {tokens})[0].toTensor(); }},
      {"eager module-level TP (dtensor)",
       [&] {
         at::Tensor out = eager->logits(tokens);
         return dtensor::is_dtensor(out) ? dtensor::full_tensor(out) : out;
       }},
      {"hand-written Megatron (raw c10d)", [&] { return hand.logits(tokens); }}});
  const at::Tensor expected = g::run(whole, {tokens})[0].toTensor();
  std::vector<Contender> contenders;
  for (auto& [name, f] : logits) {
    if (!at::allclose(f(), expected, 1e-4, 1e-5)) throw std::runtime_error(name + ": logits differ from the single-process program's");
    contenders.push_back({name, [f = f] { f(); }, {}});
  }
  time_rounds(contenders, args.rounds);
  if (mesh->world()->rank() == 0) {
    print_table(contenders, "forward");
    print_collectives(local, "forward");
  }
  return 0;
}

int run_training(const dtensor::MeshPtr& mesh, const gpt::Config& config, const Args& args) {
  g::Program whole = g::load_program(args.model);
  g::SpmdPlacements where;
  where.state = g::plan_placements(whole, *mesh, gpt::graph_plan());
  g::Program step = g::spmd_expand(g::load_program(args.model), mesh, where);
  gpt::Gpt eager = model_from(whole, config);
  gpt::parallelize(eager, mesh);
  auto hand = std::make_shared<megatron::MegatronGpt>(model_from(whole, config), config);

  const at::Tensor text = demo_tokens(config, config.seq_len + 1);
  const at::Tensor tokens = text.narrow(1, 0, config.seq_len).contiguous(), targets = text.narrow(1, 1, config.seq_len).contiguous();
  const std::vector<c10::IValue> inputs = {tokens, targets};
  const double expected = g::joint_step(whole, inputs).item<double>();
  if (!args.save_programs.empty()) {
    save_rank_program(step, *mesh, args.save_programs, inputs);
    return 0;
  }

  using torch::optim::AdamW, torch::optim::AdamWOptions;
  auto graph_adamw = std::make_shared<AdamW>(g::joint_parameters(step), AdamWOptions(kLearningRate));
  auto eager_adamw = std::make_shared<AdamW>(eager->parameters(), AdamWOptions(kLearningRate));
  auto hand_adamw = std::make_shared<AdamW>(hand->parameters(), AdamWOptions(kLearningRate));
  std::vector<std::pair<std::string, std::function<double()>>> steps;
  // The compiled step computes with parameters of its own (a second expansion's), stepped by an AdamW
  // of its own: the package reads them in place (CompiledProgram::use_state_of).
  std::optional<g::Program> compiled_step;
  std::unique_ptr<g::CompiledProgram> compiled;
  std::shared_ptr<AdamW> compiled_adamw;
  if (!args.compiled.empty()) {
    compiled_step = g::spmd_expand(g::load_program(args.model), mesh, where);
    compiled = std::make_unique<g::CompiledProgram>(rank_program_path(args.compiled, *mesh), mesh);
    compiled->use_state_of(*compiled_step);
    compiled_adamw = std::make_shared<AdamW>(g::joint_parameters(*compiled_step), AdamWOptions(kLearningRate));
    steps.push_back({"compiled graph SPMD (AOTInductor)", [&] {
                       const double loss = g::take_joint_outputs(*compiled_step, compiled->run({tokens, targets})).item<double>();
                       compiled_adamw->step();
                       return loss;
                     }});
  }
  steps.insert(steps.end(), {
      {"graph SPMD (dtensor::graph, expanded joint program)",
       [&] {
         const double loss = g::joint_step(step, inputs).item<double>();
         graph_adamw->step();
         return loss;
       }},
      {"eager module-level TP (dtensor)",
       [&] {
         at::Tensor loss = dtensor::call(eager, tokens, targets);
         loss.backward();
         eager_adamw->step();
         eager_adamw->zero_grad();
         return gpt::value_of(loss);
       }},
      {"hand-written Megatron (raw c10d)", [&] {
         at::Tensor loss = hand->forward(tokens, targets);
         loss.backward();
         hand_adamw->step();
         hand_adamw->zero_grad();
         return loss.item<double>();
       }}});
  std::vector<Contender> contenders;
  for (auto& [name, f] : steps) {
    const double loss = f();
    if (std::abs(loss - expected) > 1e-4 * std::abs(expected))
      throw std::runtime_error(name + ": first loss " + std::to_string(loss) + " differs from the single-process program's " +
                               std::to_string(expected));
    contenders.push_back({name, [f = f] { f(); }, {}});
  }
  time_rounds(contenders, args.rounds);

  g::RunStats freed, kept;
  g::run(step, inputs, {.free_after_last_use = true}, &freed);
  g::run(step, inputs, {.free_after_last_use = false}, &kept);
  if (mesh->world()->rank() == 0) {
    print_table(contenders, "training step");
    print_collectives(step, "training step");
    std::printf("\nPeak live activation bytes per rank in the expanded step (state excluded): %.2f MB freeing each value "
                "after its last use, %.2f MB keeping every value (%.1fx)\n",
                freed.peak_live_bytes / 1e6, kept.peak_live_bytes / 1e6,
                static_cast<double>(kept.peak_live_bytes) / static_cast<double>(freed.peak_live_bytes));
  }
  return 0;
}

// "hf_llama_train_ir" -> "Llama TP=4 forward", "hf_llama_joint_dp2tp2" -> "Llama DP2 x TP2 joint step".
std::string label_of(const std::string& name) {
  std::string family = name.substr(3, name.find('_', 3) - 3);
  static const std::map<std::string, std::string> proper = {{"gpt2", "GPT-2"}, {"qwen2", "Qwen2"}};
  family = proper.count(family) ? proper.at(family) : std::string(1, static_cast<char>(std::toupper(family[0]))) + family.substr(1);
  if (name.find("_joint_dp2tp2") != std::string::npos) return family + " DP2 x TP2 joint step (loss and gradients)";
  if (name.find("_joint_tp4") != std::string::npos) return family + " TP=4 joint step (loss and gradients)";
  return family + " TP=4 forward";
}

int run_saved(const std::shared_ptr<dtensor::World>& world, const Args& args) {
  namespace t = dtensor::testing;
  std::vector<std::string> rows;
  for (const std::string& name : args.names) {
    t::SavedRankProgram saved = t::load_saved_rank_program(world, args.saved + "/saved", args.saved + "/compiled", name);
    t::expect_equal_to_saved(saved, saved.compiled->run(saved.inputs), "the package");
    t::expect_equal_to_saved(saved, t::interpret(saved), "the interpreter");
    std::vector<Contender> contenders = {{"interpreter", [&] { t::interpret(saved); }, {}},
                                         {"compiled", [&] { saved.compiled->run(saved.inputs); }, {}}};
    time_rounds(contenders, args.rounds);
    const double interpreted = median(contenders[0].ms), compiled = median(contenders[1].ms);
    char row[256];
    std::snprintf(row, sizeof row, "| %s | %.2f | %.2f | %.2f |", label_of(name).c_str(), interpreted, compiled, compiled / interpreted);
    rows.push_back(row);
  }
  if (world->rank() == 0) {
    std::printf("| per-rank program | interpreter (median, ms) | compiled, AOTInductor (median, ms) | compiled / interpreter |\n|---|--:|--:|--:|\n");
    for (const std::string& row : rows) std::printf("%s\n", row.c_str());
  }
  return 0;
}

int run(const std::shared_ptr<dtensor::World>& world, const Args& args) {
  at::set_num_threads(1);
  auto mesh = dtensor::DeviceMesh::create(world, {world->size()}, {.dim_names = {"tp"}});
  megatron::tp_group() = {mesh->group(0), world->rank(), world->size()};
  if (!args.saved.empty()) return run_saved(world, args);
  const gpt::Config config = gpt::demo_config(gpt::load_corpus(dtensor::build_paths::gpt_corpus));
  return args.train ? run_training(mesh, config, args) : run_forward(mesh, config, args);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return dtensor::run_local_ranks(argc, argv, {.nprocs = args.tp}, [&](const std::shared_ptr<dtensor::World>& world) {
    return run(world, args);
  });
}
