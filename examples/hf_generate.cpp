// Greedy generation from a Hugging Face Llama at TP=4, in C++: scripts/export_hf_generate.py exports
// the model's step function (its KV cache passed in and returned, the sequence and past lengths
// dynamic), with the plan transformers writes for it and the tokens transformers' generate gave. Each
// of 4 local ranks runs its tensor-parallel program: one prefill of the prompt, then one token per
// step, the cache growing by what each step returns. The tokens must equal generate's, token for
// token, and the prefill logits the single-process program's.
//
//   hf_generate [--models DIR] [--ir train_ir|aten]   (default DIR: the build's graph_models/hf; both IRs)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/StringUtil.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "build_paths.h"
#include "dtensor/dtensor.h"
#include "dtensor/graph/hugging_face.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/tensor_parallel.h"

namespace {

namespace g = dtensor::graph;
using json = nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("hf_generate: cannot open " + path + " (scripts/export_hf_generate.py writes it)");
  return json::parse(in);
}

at::Tensor int_matrix(const json& rows) {
  std::vector<int64_t> flat;
  for (const json& row : rows)
    for (const json& x : row) flat.push_back(x.get<int64_t>());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), -1});
}

at::Tensor float_matrix(const json& rows) {
  std::vector<float> flat;
  for (const json& row : rows)
    for (const json& x : row) flat.push_back(x.get<float>());
  return at::tensor(flat, at::kFloat).view({static_cast<int64_t>(rows.size()), -1});
}

std::string ids(const at::Tensor& row) {
  const at::Tensor c = row.contiguous();
  return c10::Join(" ", std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()));
}

struct Generation {
  at::Tensor tokens;          // [batch, steps]
  at::Tensor prefill_logits;  // [batch, vocab]
};

// Greedy decoding with the step program: the prompt against an empty cache, then each chosen token
// against the cache the previous step returned.
Generation generate(g::Program& step, const at::Tensor& prompt, const json& config, int64_t steps) {
  const int64_t batch = prompt.size(0);
  const auto kv_heads = config.at("kv_heads").get<int64_t>(), head_dim = config.at("head_dim").get<int64_t>();
  std::vector<c10::IValue> inputs = {prompt};
  for (size_t k = 0; k < config.at("cache").size(); ++k) inputs.emplace_back(at::zeros({batch, kv_heads, 0, head_dim}));
  Generation out;
  std::vector<at::Tensor> chosen;
  for (int64_t s = 0; s < steps; ++s) {
    const std::vector<c10::IValue> outputs = g::run(step, inputs);
    const at::Tensor logits = outputs[0].toTensor();
    if (s == 0) out.prefill_logits = logits;
    chosen.push_back(logits.argmax(-1, /*keepdim=*/true));
    inputs[0] = chosen.back();
    for (size_t k = 1; k < outputs.size(); ++k) inputs[k] = outputs[k];
  }
  out.tokens = at::cat(chosen, 1);
  return out;
}

int count_of(const g::Graph& graph, const std::string& op) {
  int n = 0;
  for (const g::Node* node : graph.nodes()) n += node->op_name() == op;
  return n;
}

// One IR's program at TP=4: whether it generated transformers' tokens and the single-process
// program's prefill logits, on every rank.
bool generates_like_transformers(const std::shared_ptr<dtensor::World>& world, const std::string& dir, const std::string& ir,
                                 const json& config) {
  const bool print = world->rank() == 0;
  const std::string archive = dir + "/llama_generate_" + ir + ".pt2";
  auto mesh = dtensor::DeviceMesh::create(world, {world->size()}, {.dim_names = {"tp"}});
  const dtensor::ParallelizePlan plan = g::hugging_face_plan(config.at("tp_plan").dump(), "", "llama_generate.json's tp_plan");
  g::Program local = g::tensor_parallel_transform(g::load_program(archive), mesh, plan);
  g::Program whole = g::load_program(archive);

  const at::Tensor prompt = int_matrix(config.at("prompt")), expected = int_matrix(config.at("generated"));
  const int64_t steps = expected.size(1);
  const Generation ours = generate(local, prompt, config, steps);
  const Generation reference = generate(whole, prompt, config, 1);
  const double diff = (ours.prefill_logits - reference.prefill_logits).abs().max().item<double>();
  const double diff_to_python = (ours.prefill_logits - float_matrix(config.at("prefill_logits"))).abs().max().item<double>();
  if (print) {
    std::cout << "Hugging Face Llama (" << config.at("layers") << " layers, " << config.at("heads") << " heads over "
              << config.at("kv_heads") << " KV heads), " << ir << ", TP=" << world->size() << ", greedy, " << steps
              << " new tokens per row; collectives per step: " << count_of(local.graph, "_c10d_functional::all_reduce")
              << " all-reduce, " << count_of(local.graph, "_c10d_functional::all_gather_into_tensor") << " all-gather\n";
    for (int64_t b = 0; b < ours.tokens.size(0); ++b)
      std::cout << "  row " << b << ": " << ids(ours.tokens[b]) << "  (transformers: " << ids(expected[b]) << ")\n";
    std::cout << "  prefill logits: largest difference to the single-process program " << diff << ", to PyTorch's "
              << diff_to_python << "\n";
  }
  return at::equal(ours.tokens, expected) && at::allclose(ours.prefill_logits, reference.prefill_logits, 1e-4, 1e-5);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::string(dtensor::build_paths::graph_models) + "/hf";
  std::vector<std::string> irs = {"train_ir", "aten"};
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--models") dir = argv[i + 1];
    if (std::string(argv[i]) == "--ir") irs = {argv[i + 1]};
  }
  const json config = read_json(dir + "/llama_generate.json");
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 4}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);
    bool ok = true;
    for (const std::string& ir : irs) ok = generates_like_transformers(world, dir, ir, config) && ok;
    const int64_t failures = world->sum_across_ranks(ok ? 0 : 1);
    if (world->rank() == 0)
      std::cout << (failures == 0 ? "PASS: every rank's tokens equal transformers' generate, token for token\n"
                                  : "FAIL: the tokens or the prefill logits differ\n");
    return failures == 0 ? 0 : 1;
  });
}
