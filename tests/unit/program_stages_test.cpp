// Exported programs cut into pipeline stages (dtensor/graph/program_stages.h), in one process: the
// Hugging Face models split by their own pipeline plans (model.pp_plan as transformers writes it) and
// at every layer; run one after another, the stages compute the whole program's logits, and a joint
// program's stages and loss, under LibTorch autograd, PyTorch's eager loss and gradients
// (scripts/export_hf_models.py). Each stage saves as a .pt2 and runs the same once loaded back. Cuts
// that cannot work are refused, naming what to change.

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include <filesystem>

#include "../support/error_of.h"
#include "../support/tensor_assertions.h"
#include "../support/test_models.h"
#include "dtensor/graph/program_stages.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;
namespace g = dtensor::graph;

// The families with a pipeline plan: GPT-2 has none in transformers.
const std::vector<std::string> kFamilies = {"llama", "mistral", "qwen2", "mixtral"};
// Every layer a stage of its own: embeddings | layer 0 | layer 1 | norm and head.
const std::vector<std::string> kEveryLayer = {"model.layers.0", "model.layers.1", "model.norm"};

std::vector<std::string> own_plan_points(const g::Program& program, const std::string& family, int stages) {
  return g::pp_plan_split_points(program, graph_model_text("hf/" + family + "_pp_plan.json"), stages, "", family + "_pp_plan.json");
}

at::Tensor run_stages(const g::ProgramStages& parts, at::Tensor x) {
  for (const auto& stage : parts.stages) x = g::run(*stage, {x}).at(0).toTensor();
  return x;
}

TEST(ProgramStagesTest, TheOwnPlanSpreadsTheLayers) {
  const g::Program program = g::load_program(graph_model("hf/llama_train_ir.pt2"));
  EXPECT_EQ(own_plan_points(program, "llama", 2), std::vector<std::string>{"model.layers.1"});
  EXPECT_EQ(own_plan_points(program, "llama", 1), std::vector<std::string>{});
  EXPECT_THAT(error_of([&] { own_plan_points(program, "llama", 3); }), HasSubstr("too few for 3 stages"));
}

TEST(ProgramStagesTest, ForwardStagesComputeTheWholeProgramsLogits) {
  for (const std::string& family : kFamilies) {
    SCOPED_TRACE(family);
    g::Program whole = g::load_program(graph_model("hf/" + family + "_train_ir.pt2"));
    const auto io = tensor_map("hf/" + family + "_io");
    const at::Tensor expected = g::run(whole, {io.at("input0")}).at(0).toTensor();
    EXPECT_TRUE(tensors_close(expected, io.at("output0"), 1e-5, 1e-5));
    for (const auto& points : {own_plan_points(whole, family, 2), kEveryLayer}) {
      const g::ProgramStages parts = g::split_program(whole, points);
      ASSERT_EQ(parts.stages.size(), points.size() + 1);
      EXPECT_FALSE(parts.loss);
      EXPECT_TRUE(at::equal(run_stages(parts, io.at("input0")), expected));
    }
  }
}

// The training IR carries module paths: each stage holds its own modules' ops, and ops of no stage's
// modules (the root's, the rotary embedding's) only where they are computed from buffers and constants or
// between the stages' modules.
TEST(ProgramStagesTest, StagesHoldTheirModulesOps) {
  const g::Program whole = g::load_program(graph_model("hf/llama_train_ir.pt2"));
  const g::ProgramStages parts = g::split_program(whole, kEveryLayer);
  const std::vector<std::vector<std::string>> owned = {{"model.embed_tokens"}, {"model.layers.0"}, {"model.layers.1"}, {"model.norm", "lm_head"}};
  for (size_t s = 0; s < parts.stages.size(); ++s)
    for (const g::Node* n : parts.stages[s]->graph.nodes())
      for (size_t other = 0; other < owned.size(); ++other)
        for (const std::string& module : owned[other])
          if (other != s) EXPECT_NE(n->module_path.rfind(module, 0), 0u) << "stage " << s << " runs " << n->name << " of " << n->module_path;
}

TEST(ProgramStagesTest, EachStageSavesAndRunsTheSameLoadedBack) {
  const g::Program whole = g::load_program(graph_model("hf/llama_train_ir.pt2"));
  const g::ProgramStages parts = g::split_program(whole, kEveryLayer);
  const auto dir = std::filesystem::temp_directory_path() / ("dtensor_program_stages_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  at::Tensor x = tensor_map("hf/llama_io").at("input0");
  for (size_t s = 0; s < parts.stages.size(); ++s) {
    const std::string path = (dir / ("stage" + std::to_string(s) + ".pt2")).string();
    g::save_program(*parts.stages[s], path, {.sample_inputs = {x}});
    g::Program loaded = g::load_program(path);
    const at::Tensor y = g::run(*parts.stages[s], {x}).at(0).toTensor();
    EXPECT_TRUE(at::equal(g::run(loaded, {x}).at(0).toTensor(), y)) << "stage " << s;
    x = y;
  }
  std::filesystem::remove_all(dir);
}

// Every stage's parameters by name, set to require grad.
std::map<std::string, at::Tensor> parameters_by_name(const g::ProgramStages& parts) {
  std::map<std::string, at::Tensor> out;
  for (const auto& stage : parts.stages)
    for (const auto& [name, tensor] : g::stage_parameters(*stage)) EXPECT_TRUE(out.emplace(name, tensor).second) << name << " in two stages";
  return out;
}

// A joint program's forward part in stages and its loss: LibTorch autograd through them gives what
// PyTorch's eager model gives, loss and every parameter's gradient.
TEST(ProgramStagesTest, JointStagesGiveEagerLossAndGradients) {
  for (const std::string& family : kFamilies) {
    SCOPED_TRACE(family);
    const auto io = tensor_map("hf/" + family + "_joint_io");
    for (const bool own_plan : {true, false}) {
      const g::Program joint = g::load_program(graph_model("hf/" + family + "_joint.pt2"));
      const g::ProgramStages parts = g::split_program(joint, own_plan ? own_plan_points(joint, family, 2) : kEveryLayer);
      ASSERT_TRUE(parts.loss);
      const std::map<std::string, at::Tensor> parameters = parameters_by_name(parts);
      const at::Tensor loss = g::run(*parts.loss, {run_stages(parts, io.at("input0")), io.at("input1")}).at(0).toTensor();
      loss.backward();
      EXPECT_TRUE(tensors_close(loss.detach(), io.at("loss"), 1e-5, 1e-6));
      size_t joint_parameters = 0;
      for (const g::InputSpec& spec : joint.inputs) joint_parameters += spec.kind == g::InputSpec::Kind::Parameter;
      EXPECT_EQ(parameters.size(), joint_parameters);
      for (const auto& [name, tensor] : parameters) {
        ASSERT_TRUE(tensor.grad().defined()) << name;
        EXPECT_TRUE(tensors_close(tensor.grad(), io.at("grad." + name), 1e-4, 1e-5)) << name;
      }
    }
  }
}

// Two parameters and an input read again after the cut: x * w0 | (x * w0) * w1 + x.
g::Program skipping_program() {
  g::Program p;
  g::Value* w0 = p.graph.add_input("w0");
  g::Value* w1 = p.graph.add_input("w1");
  g::Value* x = p.graph.add_input("x");
  p.inputs = {{g::InputSpec::Kind::Parameter, w0, "l0.weight"}, {g::InputSpec::Kind::Parameter, w1, "l1.weight"}, {g::InputSpec::Kind::UserInput, x, ""}};
  g::Value* a = p.graph.insert(nullptr, "aten::mul.Tensor", {g::Arg::tensor(x), g::Arg::tensor(w0)}, "a")->outputs[0];
  g::Value* b = p.graph.insert(nullptr, "aten::mul.Tensor", {g::Arg::tensor(a), g::Arg::tensor(w1)}, "b")->outputs[0];
  g::Value* c = p.graph.insert(nullptr, "aten::add.Tensor", {g::Arg::tensor(b), g::Arg::tensor(x)}, "c")->outputs[0];
  p.graph.add_output(g::Arg::tensor(c));
  p.outputs = {{g::OutputSpec::Kind::UserOutput, ""}};
  return p;
}

TEST(ProgramStagesTest, CutsThatCannotWorkAreRefused) {
  const g::Program llama = g::load_program(graph_model("hf/llama_train_ir.pt2"));
  EXPECT_THAT(error_of([&] { g::split_program(llama, {"model.blocks.1"}); }),
              HasSubstr("split point 'model.blocks.1' names no module with parameters; the program's modules: model.embed_tokens, model.layers.0.self_attn.q_proj"));
  EXPECT_THAT(error_of([&] { g::split_program(llama, {"model.norm", "model.layers.1"}); }),
              HasSubstr("split point 'model.layers.1' comes before the one ahead of it ('model.norm')"));
  EXPECT_THAT(error_of([&] { g::split_program(llama, {"model.embed_tokens"}); }), HasSubstr("leaves stage 0 empty"));
  EXPECT_THAT(error_of([&] { g::split_program(llama, {"model.layers.1", "model.layers.1.self_attn"}); }),
              HasSubstr("split points 'model.layers.1' and 'model.layers.1.self_attn' start at the same parameter"));
  // Llama's layers register attention, MLP, then the norms: a cut at the MLP is no forward boundary.
  EXPECT_THAT(error_of([&] { g::split_program(llama, {"model.layers.1.mlp"}); }),
              HasSubstr("parameter 'model.layers.1.self_attn.q_proj.weight' comes in stage 0 by the program's order of parameters, but stage 1 reads it"));
  EXPECT_THAT(error_of([&] { g::split_program(skipping_program(), {"l1"}); }),
              HasSubstr("stage 0 would hand stage 1 2 tensors (%a, %x); a stage hands the next one tensor"));
  // Microbatches of another size than the program was exported with.
  const g::ProgramStages parts = g::split_program(llama, {"model.layers.1"});
  const dtensor::pipeline::PipelineStage second = g::pipeline_stage(parts.stages[1], 1);
  EXPECT_THAT(error_of([&] { second.forward(at::zeros({1, 16, 32})); }),
              HasSubstr("stage 1's input is [1, 16, 32] Float, but the program was exported for [2, 16, 32] Float: give microbatches of the exported size"));
  const g::Program joint = g::load_program(graph_model("hf/llama_joint.pt2"));
  const auto loss = g::pipeline_loss(g::split_program(joint, {"model.layers.1"}).loss);
  EXPECT_THAT(error_of([&] { loss(at::zeros({4, 16, 62}), at::zeros({4, 15}, at::kLong)); }), HasSubstr("the loss's labels is [4, 15] Long"));
  EXPECT_THAT(error_of([&] { g::pp_plan_split_points(llama, "[1]", 2); }), HasSubstr("a pipeline plan is a JSON object"));
  EXPECT_THAT(error_of([&] { g::pp_plan_split_points(llama, R"({"model.layers": ["hidden_states"]})", 2); }),
              HasSubstr("entry 'model.layers' is not [[input names], [output names]]"));
  EXPECT_THAT(error_of([&] { g::pp_plan_split_points(llama, R"({"layers": [["h"], ["h"]]})", 2); }),
              HasSubstr("entry 'layers' names no module of"));
  EXPECT_THAT(error_of([&] { g::pp_plan_split_points(llama, R"({"model.norm": [["h"], ["h"]]})", 2); }), HasSubstr("no entry is a list of layers"));
  EXPECT_EQ(g::pp_plan_split_points(llama, R"({"layers": [["h"], ["h"]], "norm": [["h"], ["h"]]})", 2, "model"),
            std::vector<std::string>{"model.layers.1"});
}

}  // namespace
}  // namespace dtensor::testing
