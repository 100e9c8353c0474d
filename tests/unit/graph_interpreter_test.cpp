// Reading torch.export archives and running them: every exported model, in both IRs, static and
// dynamic batch, equals PyTorch's own outputs (ep.module()(*inputs), written at build time), and the
// weights read from the archive equal the model's state dict. Bad archives: tests/files/pt2_reader_test.cpp.

#include <ATen/ATen.h>

#include <filesystem>

#include <gmock/gmock.h>

#include "../support/error_of.h"
#include "../support/tensor_assertions.h"
#include "../support/test_models.h"
#include "dtensor/graph/program.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;
namespace g = dtensor::graph;

// Runs every input set of `archive` and compares each output with PyTorch's (rel 1e-5).
void expect_outputs_match(const std::string& archive, const std::vector<std::string>& io_sets) {
  g::Program program = g::load_program(graph_model(archive + ".pt2"));
  for (const auto& set : io_sets) {
    SCOPED_TRACE(archive + " " + set);
    std::vector<c10::IValue> inputs;
    std::vector<at::Tensor> expected;
    for (const auto& [name, t] : load_tensor_set(set)) {
      if (name.rfind("input", 0) == 0) inputs.emplace_back(t);
      else expected.push_back(t);
    }
    const auto outputs = g::run(program, inputs);
    ASSERT_EQ(outputs.size(), expected.size());
    for (size_t k = 0; k < outputs.size(); ++k)
      EXPECT_TRUE(tensors_close(outputs[k].toTensor(), expected[k], 1e-5, 1e-6)) << "output " << k;
  }
}

// Hugging Face causal LMs (scripts/export_hf_models.py): rotary embeddings, grouped-query attention,
// HF's in-graph causal mask, GPT-2's Conv1D and tied embeddings; training IR and core ATen.
TEST(GraphInterpreterTest, HuggingFaceModelsInBothIrs) {
  for (const std::string& family : hugging_face_families())
    for (const std::string ir : {"_train_ir", "_aten"}) expect_outputs_match("hf/" + family + ir, {"hf/" + family + "_io"});
}

TEST(GraphInterpreterTest, MlpEqualsPyTorch) {
  expect_outputs_match("mlp", {"mlp_io"});
}

// Without grad mode the nodes dispatch below autograd (faster); with it, autograd records through
// the run as through eager code. Both give the same values.
TEST(GraphInterpreterTest, RunsRecordAutogradOnlyInGradMode) {
  g::Program program = g::load_program(graph_model("mlp.pt2"));
  std::vector<c10::IValue> inputs;
  for (const auto& [name, t] : load_tensor_set("mlp_io"))
    if (name.rfind("input", 0) == 0) inputs.emplace_back(t);
  at::Tensor weight = program.state.begin()->second.tensor();
  weight.requires_grad_(true);
  const at::Tensor recorded = g::run(program, inputs).at(0).toTensor();
  ASSERT_TRUE(recorded.requires_grad()) << "grad mode on: the output depends on a parameter that requires grad";
  recorded.sum().backward();
  ASSERT_TRUE(weight.grad().defined());
  EXPECT_GT(weight.grad().abs().sum().item<double>(), 0.0);

  at::Tensor plain;
  {
    at::NoGradGuard no_grad;
    plain = g::run(program, inputs).at(0).toTensor();
  }
  EXPECT_FALSE(plain.requires_grad());
  EXPECT_FALSE(plain.is_inference());
  EXPECT_TRUE(tensors_equal(plain, recorded.detach()));
  EXPECT_FALSE(c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::AutogradCPU)) << "the run restores the caller's dispatch";
  weight.requires_grad_(false);
}

TEST(GraphInterpreterTest, BuffersConstantsAndMutationsInBothIrs) {
  // Training IR mutates the counter buffer in place; core ATen returns it as a buffer mutation.
  for (const std::string archive : {"mlp_extras", "mlp_extras_aten"}) {
    SCOPED_TRACE(archive);
    g::Program program = g::load_program(graph_model(archive + ".pt2"));
    EXPECT_EQ(program.state.at("calls").tensor().item<int64_t>(), 0);
    expect_outputs_match(archive, {archive + "_io"});
    std::vector<c10::IValue> inputs;
    for (const auto& [name, t] : load_tensor_set(archive + "_io"))
      if (name.rfind("input", 0) == 0) inputs.emplace_back(t);
    g::run(program, inputs);
    EXPECT_EQ(program.state.at("calls").tensor().item<int64_t>(), 1) << "the buffer mutation was not applied";
  }
}

TEST(GraphInterpreterTest, GptInBothIrsStaticAndDynamic) {
  expect_outputs_match("gpt_train_ir_static", {"gpt_train_ir_static_io_b8"});
  expect_outputs_match("gpt_aten_static", {"gpt_aten_static_io_b8"});
  // One program, two batch sizes, no re-export.
  expect_outputs_match("gpt_train_ir_dynamic", {"gpt_train_ir_dynamic_io_b8", "gpt_train_ir_dynamic_io_b3"});
  expect_outputs_match("gpt_aten_dynamic", {"gpt_aten_dynamic_io_b8", "gpt_aten_dynamic_io_b3"});
}

TEST(GraphInterpreterTest, JointGraphGivesLossAndGradients) {
  g::Program program = g::load_program(graph_model("gpt_joint.pt2"));
  const auto io = tensor_map("gpt_joint_io");
  const auto outputs = g::run(program, {io.at("input0"), io.at("input1")});
  ASSERT_EQ(outputs.size(), program.outputs.size());
  EXPECT_TRUE(tensors_close(outputs[0].toTensor(), io.at("loss"), 1e-5, 1e-6));
  for (size_t k = 1; k < outputs.size(); ++k) {
    ASSERT_EQ(program.outputs[k].kind, g::OutputSpec::Kind::GradientToParameter);
    EXPECT_TRUE(tensors_close(outputs[k].toTensor(), io.at("grad." + program.outputs[k].target), 1e-4, 1e-6))
        << program.outputs[k].target;
  }
}

TEST(GraphInterpreterTest, WeightsEqualTheStateDict) {
  g::Program program = g::load_program(graph_model("gpt_aten_static.pt2"));
  for (const auto& [fqn, t] : load_tensor_set("gpt_params")) EXPECT_TRUE(tensors_equal(program.state.at(fqn).tensor(), t)) << fqn;
}

TEST(GraphInterpreterTest, FreeingAfterLastUseLowersThePeak) {
  g::Program program = g::load_program(graph_model("gpt_aten_static.pt2"));
  const auto io = tensor_map("gpt_aten_static_io_b8");
  g::RunStats freed, kept;
  g::run(program, {io.at("input0")}, {.free_after_last_use = true}, &freed);
  g::run(program, {io.at("input0")}, {.free_after_last_use = false}, &kept);
  EXPECT_GT(freed.peak_live_bytes, 0);
  EXPECT_LT(freed.peak_live_bytes * 3, kept.peak_live_bytes) << freed.peak_live_bytes << " vs " << kept.peak_live_bytes;
}

TEST(GraphInterpreterTest, PrinterShowsOneLinePerNodeWithModulePaths) {
  g::Program program = g::load_program(graph_model("gpt_train_ir_static.pt2"));
  const std::string text = program.graph.str();
  EXPECT_THAT(text, HasSubstr("aten::linear(%layer_norm, %p_blocks_0_attn_wq_weight, %p_blocks_0_attn_wq_bias)"));
  EXPECT_THAT(text, HasSubstr("# blocks.0.attn.wq"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'),
            static_cast<long>(program.graph.size() + program.graph.inputs().size() + 1));
}

// Saved programs load back and run alike; scripts/check_saved_programs.py then runs them in PyTorch
// (torch.export.load) against PyTorch's own outputs, on the sample inputs saved with them.
TEST(GraphInterpreterTest, SavedProgramsRoundTrip) {
  for (const auto& [archive, io] : std::vector<std::pair<std::string, std::string>>{
           {"mlp", "mlp_io"}, {"gpt_aten_static", "gpt_aten_static_io_b8"}, {"gpt_train_ir_dynamic", "gpt_train_ir_dynamic_io_b3"}}) {
    SCOPED_TRACE(archive);
    const auto set = tensor_map(io);
    g::save_program(g::load_program(graph_model(archive + ".pt2")), graph_saved(archive + ".pt2"), {.sample_inputs = {set.at("input0")}});
    g::Program again = g::load_program(graph_saved(archive + ".pt2"));
    const auto out = g::run(again, {set.at("input0")});
    EXPECT_TRUE(tensors_close(out[0].toTensor(), set.at("output0"), 1e-5, 1e-6));
  }
}

// Sample inputs must be what the program takes: the count, the dtype, the sizes where static (the
// dynamic GPT's batch takes any size).
TEST(GraphInterpreterTest, SampleInputsThatDoNotFitAreRefused) {
  const g::Program mlp = g::load_program(graph_model("mlp.pt2"));
  const at::Tensor input = tensor_map("mlp_io").at("input0");
  const std::string path = graph_saved("refused_sample_inputs.pt2");
  EXPECT_THAT(error_of([&] { g::save_program(mlp, path, {.sample_inputs = {input, input}}); }),
              HasSubstr("sample inputs: the program takes 1 user inputs, got 2"));
  EXPECT_THAT(error_of([&] { g::save_program(mlp, path, {.sample_inputs = {input.to(at::kDouble)}}); }),
              HasSubstr("sample input 0 ('x') is Double [4, 16]; the program takes Float [4, 16]"));
  EXPECT_THAT(error_of([&] { g::save_program(mlp, path, {.sample_inputs = {input.narrow(1, 0, 8)}}); }),
              HasSubstr("is Float [4, 8]; the program takes Float [4, 16]"));
  EXPECT_THAT(error_of([&] { g::save_program(mlp, path, {.sample_inputs = {c10::IValue(int64_t{3})}}); }),
              HasSubstr("the program takes a tensor here, got Int"));
  EXPECT_FALSE(std::filesystem::exists(path));
  const g::Program dynamic = g::load_program(graph_model("gpt_train_ir_dynamic.pt2"));
  EXPECT_NO_THROW(g::save_program(dynamic, path, {.sample_inputs = {tensor_map("gpt_train_ir_dynamic_io_b8").at("input0")}}));
  std::filesystem::remove(path);
}

// torch's generated F64 writer spells -inf "Infinity"; a saved program keeps it -inf (HF's causal mask
// fills with it in core ATen).
TEST(GraphInterpreterTest, SavedProgramsKeepNegativeInfinity) {
  auto minus_infinities = [](const g::Program& program) {
    std::vector<std::string> nodes;
    for (const g::Node* n : program.graph.nodes())
      for (const g::Arg& a : n->args())
        if (a.constant.isDouble() && a.constant.toDouble() == -std::numeric_limits<double>::infinity()) nodes.push_back(n->name);
    return nodes;
  };
  const g::Program program = g::load_program(graph_model("hf/llama_aten.pt2"));
  const auto expected = minus_infinities(program);
  ASSERT_FALSE(expected.empty()) << "the model has no -inf argument: pick one that has";
  g::save_program(program, graph_saved("llama_aten.pt2"));
  EXPECT_EQ(minus_infinities(g::load_program(graph_saved("llama_aten.pt2"))), expected);
}

}  // namespace
}  // namespace dtensor::testing
