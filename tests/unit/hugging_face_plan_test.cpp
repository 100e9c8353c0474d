// Hugging Face tensor-parallel plans read as transformers writes them (dtensor/graph/hugging_face.h):
// the model's own plan, a config's base_model_tp_plan under a prefix, and the errors for styles with
// no mapping.

#include <algorithm>
#include <gmock/gmock.h>

#include "../support/error_of.h"
#include "../support/test_models.h"
#include "dtensor/graph/hugging_face.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;
namespace g = dtensor::graph;

const ColwiseParallel* colwise(const PlanEntry& e) { return std::get_if<ColwiseParallel>(&e.style); }
const RowwiseParallel* rowwise(const PlanEntry& e) { return std::get_if<RowwiseParallel>(&e.style); }

// Llama's plan as `model.tp_plan` wrote it: every entry mapped, in the file's order.
TEST(HuggingFacePlanTest, LlamasOwnPlan) {
  const ParallelizePlan plan = g::hugging_face_plan(graph_model_text("hf/llama_tp_plan.json"));
  ASSERT_EQ(plan.size(), 9u);
  EXPECT_EQ(plan[0].path, "lm_head");
  std::map<std::string, const PlanEntry*> by_path;
  for (const PlanEntry& e : plan) by_path[e.path] = &e;
  ASSERT_TRUE(colwise(*by_path.at("lm_head")));  // colwise_gather_output
  EXPECT_EQ(colwise(*by_path.at("lm_head"))->output_layout, Replicate());
  EXPECT_TRUE(rowwise(*by_path.at("model.embed_tokens")));  // embedding_rowwise
  EXPECT_TRUE(colwise(*by_path.at("model.layers.*.self_attn.k_proj")));
  EXPECT_TRUE(rowwise(*by_path.at("model.layers.*.mlp.down_proj")));
  // Optional (skipped where they match nothing, as transformers skips them), unless read strictly.
  EXPECT_TRUE(std::all_of(plan.begin(), plan.end(), [](const PlanEntry& e) { return e.optional; }));
  const ParallelizePlan strict = g::hugging_face_plan(graph_model_text("hf/llama_tp_plan.json"), "", "llama_tp_plan.json", true);
  EXPECT_TRUE(std::none_of(strict.begin(), strict.end(), [](const PlanEntry& e) { return e.optional; }));
}

// Mixtral's plan names its experts' 3-d weights themselves: gate/up packed column-parallel, down
// row-parallel; the experts module's own style (sum the ranks' partial outputs) needs no entry.
TEST(HuggingFacePlanTest, MixtralsExpertsPlan) {
  const ParallelizePlan plan = g::hugging_face_plan(graph_model_text("hf/mixtral_tp_plan.json"));
  std::map<std::string, const PlanEntry*> by_path;
  for (const PlanEntry& e : plan) by_path[e.path] = &e;
  ASSERT_TRUE(colwise(*by_path.at("model.layers.*.mlp.experts.gate_up_proj")));
  EXPECT_EQ(colwise(*by_path.at("model.layers.*.mlp.experts.gate_up_proj"))->packed, 2);
  EXPECT_TRUE(rowwise(*by_path.at("model.layers.*.mlp.experts.down_proj")));
  EXPECT_EQ(by_path.count("model.layers.*.mlp.experts"), 0u);
}

TEST(HuggingFacePlanTest, AConfigsBasePlanTakesThePrefix) {
  const std::string config = graph_model_text("hf/qwen2_config.json");
  const auto plan = g::hugging_face_plan(
      R"({"base_model_tp_plan": {"layers.*.mlp.gate_up_proj": "packed_colwise", "layers.*.mlp.down_proj": "rowwise",
          "norm": "replicate", "layers.*.input_layernorm": "replicated_with_grad_allreduce"}})",
      "model");
  ASSERT_EQ(plan.size(), 2u);  // the replicated entries need none
  EXPECT_EQ(plan[0].path, "model.layers.*.mlp.gate_up_proj");
  EXPECT_EQ(colwise(plan[0])->packed, 2);
  EXPECT_EQ(plan[1].path, "model.layers.*.mlp.down_proj");
  // A real config.json as save_pretrained writes it holds no plan (transformers keeps it on the class).
  EXPECT_TRUE(g::hugging_face_plan(config, "model").empty());
}

// Mixtral's `model.ep_plan` as transformers 5.24 writes it: the experts module spread over the ep dim,
// its weights' grouped_gemm entries covered by that entry.
TEST(HuggingFacePlanTest, MixtralsExpertParallelPlan) {
  const std::string written = R"({"model.layers.*.mlp.experts.gate_up_proj": "grouped_gemm",
      "model.layers.*.mlp.experts.down_proj": "grouped_gemm", "model.layers.*.mlp.experts": "ep_dispatch_experts"})";
  const ParallelizePlan plan = g::hugging_face_ep_plan(written, "", "mixtral_ep_plan.json");
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].path, "model.layers.*.mlp.experts");
  EXPECT_TRUE(std::holds_alternative<ExpertParallel>(plan[0].style));
  EXPECT_TRUE(plan[0].optional);
  // A config's base_model_ep_plan takes the prefix; its tensor-parallel plan is another key.
  const std::string config = R"({"model_type": "mixtral", "base_model_ep_plan": {"layers.*.mlp.experts": "ep_dispatch_experts"}})";
  EXPECT_EQ(g::hugging_face_ep_plan(config, "model").at(0).path, "model.layers.*.mlp.experts");
  EXPECT_TRUE(g::hugging_face_plan(config, "model").empty());
}

TEST(HuggingFacePlanTest, StylesWithoutMappingAreRefusedByName) {
  EXPECT_THAT(error_of([] { g::hugging_face_plan(R"({"model.layers.*.mlp.experts": "moe_identity_expert"})", "", "plan.json"); }),
              HasSubstr("plan.json: entry 'model.layers.*.mlp.experts': the Hugging Face style 'moe_identity_expert' "
                        "(an identity expert of a mixture of experts) has no graph-level mapping"));
  EXPECT_THAT(error_of([] { g::hugging_face_plan(R"({"model.layers.*.self_attn.q_a_proj": "mla_kv_a_proj"})"); }),
              HasSubstr("'mla_kv_a_proj'"));
  EXPECT_THAT(error_of([] { g::hugging_face_plan(R"({"lm_head": "colwize"})"); }),
              HasSubstr("entry 'lm_head': 'colwize' is no Hugging Face tensor-parallel style that dtensor knows; styles mapped: "
                        "all_reduce, colwise, colwise_gather_output"));
  EXPECT_THAT(error_of([] { g::hugging_face_plan(R"({"lm_head": 3})"); }), HasSubstr("the style must be a string, got number"));
  EXPECT_THAT(error_of([] { g::hugging_face_plan("[1, 2]"); }), HasSubstr("a JSON object of module path -> style name, got array"));
  EXPECT_THAT(error_of([] { g::hugging_face_plan("{\"lm_head\": "); }), HasSubstr("is not JSON"));
}

}  // namespace
}  // namespace dtensor::testing
