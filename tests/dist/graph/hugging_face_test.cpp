// Hugging Face causal LMs (scripts/export_hf_models.py: Llama with 2 KV heads, Mistral, Qwen2, Mixtral's
// mixture of experts, GPT-2)
// tensor-parallelised by graph plans on real ranks, with the plans transformers writes taken as they
// are: the logits equal PyTorch's on one process, on 4 ranks and on a 2x2 mesh, in the training IR and
// in core ATen, with Megatron's collectives; the joint training graphs with Hugging Face's own loss,
// SPMD-expanded on TP=4 and DP2 x TP2, train like one process.

#include <ATen/ATen.h>

#include "../harness.h"
#include "expect_saves.h"
#include "joint_step_matches.h"
#include "sequence_parallel_norms.h"
#include "adamw_losses.h"
#include "../../support/test_models.h"
#include "dtensor/graph/hugging_face.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/spmd.h"
#include "dtensor/graph/tensor_parallel.h"
#include "dtensor/graph/training.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;
namespace g = dtensor::graph;

constexpr int64_t kLayers = 2;  // every family's config in export_hf_models.py

// Each family's own plan, as transformers writes it. GPT-2 has none (transformers' styles do not fit
// its Conv1D layers): Megatron's, with the q/k/v projection packed in three blocks.
ParallelizePlan plan_of(const std::string& family) {
  if (family == "gpt2")
    return {{"transformer.wte", RowwiseParallel{}},
            {"transformer.h.*.attn.c_attn", ColwiseParallel{.packed = 3}},
            {"transformer.h.*.attn.c_proj", RowwiseParallel{}},
            {"transformer.h.*.mlp.c_fc", ColwiseParallel{}},
            {"transformer.h.*.mlp.c_proj", RowwiseParallel{}}};
  return g::hugging_face_plan(graph_model_text("hf/" + family + "_tp_plan.json"), "", family + "_tp_plan.json");
}

at::Tensor logits_of(g::Program& local, const std::string& family) {
  return g::run(local, {tensor_map("hf/" + family + "_io").at("input0")})[0].toTensor();
}

// Megatron's pattern per forward: the vocabulary-parallel embedding's all-reduce, one per row-parallel
// layer (attention output, MLP output), the logits gathered from the column-parallel head. Nothing
// else: grouped-query attention with fewer KV heads than ranks replicates the KV projections rather
// than gathering k and v in every layer.
const std::map<std::string, int> kMegatron = {{"_c10d_functional::all_reduce", 1 + 2 * kLayers},
                                              {"_c10d_functional::all_gather_into_tensor", 1}};

class HuggingFaceTensorParallelTest : public DistTest {};

TEST_F(HuggingFaceTensorParallelTest, EveryFamilyWithItsPlanOnFourRanks) {
  for (const std::string& family : hugging_face_families()) {
    for (const std::string ir : {"_train_ir", "_aten"}) {
      SCOPED_TRACE(family + ir);
      g::Program local = g::tensor_parallel_transform(g::load_program(graph_model("hf/" + family + ir + ".pt2")), mesh({4}),
                                                      plan_of(family));
      EXPECT_TRUE(tensors_close(logits_of(local, family), tensor_map("hf/" + family + "_io").at("output0"), 1e-4, 1e-5));
      EXPECT_EQ(collectives_in(local), kMegatron) << local.str();
      expect_saves(local, "hf_" + family + ir, {tensor_map("hf/" + family + "_io").at("input0")});
    }
  }
}

TEST_F(HuggingFaceTensorParallelTest, EveryFamilyOnTheTpDimOfATwoDimMesh) {
  const MeshPtr m = mesh({2, 2}, {}, {"dp", "tp"});
  for (const std::string& family : hugging_face_families()) {
    SCOPED_TRACE(family);
    g::Program local = g::tensor_parallel_transform(g::load_program(graph_model("hf/" + family + "_train_ir.pt2")), m,
                                                    plan_of(family), {.tp_dim = "tp"});
    EXPECT_TRUE(tensors_close(logits_of(local, family), tensor_map("hf/" + family + "_io").at("output0"), 1e-4, 1e-5));
    EXPECT_EQ(collectives_in(local), kMegatron) << local.str();
    expect_saves(local, "hf_" + family + "_2d_mesh", {tensor_map("hf/" + family + "_io").at("input0")});
  }
}

// Llama's plan with transformers' sequence_parallel style on its norms (Megatron's sequence
// parallelism): every output of the norms' nodes is Shard(1) over tp, the sequence, and the logits
// equal PyTorch's, through the TP transform and through spmd_expand on dp x tp of the forward program.
// A joint program (no module paths recorded) is refused.
TEST_F(HuggingFaceTensorParallelTest, SequenceParallelNormsKeepTheSequenceSharded) {
  const ParallelizePlan plan = with_sequence_parallel_norms(plan_of("llama"));
  g::Program local = g::tensor_parallel_transform(g::load_program(graph_model("hf/llama_train_ir.pt2")), mesh({4}), plan);
  EXPECT_TRUE(tensors_close(logits_of(local, "llama"), tensor_map("hf/llama_io").at("output0"), 1e-4, 1e-5));
  const auto [outputs, sharded] = norm_outputs_on_sequence_shards(local, 0);
  EXPECT_GT(outputs, 0);
  EXPECT_EQ(sharded, outputs) << local.str();
  // Megatron's sequence parallelism: each all-reduce (the embedding's, each row-parallel layer's)
  // becomes a reduce-scatter along the sequence, and each column-parallel block all-gathers it back;
  // the logits are gathered once.
  EXPECT_EQ(collectives_in(local), (std::map<std::string, int>{{"_c10d_functional::reduce_scatter_tensor", 1 + 2 * kLayers},
                                                               {"_c10d_functional::all_gather_into_tensor", 1 + 2 * kLayers + 1}}))
      << g::collectives_report(local);
  expect_saves(local, "hf_llama_sequence_parallel", {tensor_map("hf/llama_io").at("input0")});

  // spmd_expand on dp x tp: the batch over dp, the plan over tp.
  const MeshPtr m = mesh({2, 2}, {}, {"dp", "tp"});
  g::Program whole = g::load_program(graph_model("hf/llama_train_ir.pt2"));
  g::SpmdPlacements where;
  where.user_inputs = {{Shard(0), Replicate()}};
  where.state = g::plan_placements(whole, *m, plan, {.tp_dim = "tp"});
  where.sequence_sharded = g::plan_sequence_parallel(whole, *m, plan, {.tp_dim = "tp"});
  where.outputs = {{0, Placements(2, Replicate())}};
  g::Program expanded = g::spmd_expand(std::move(whole), m, where);
  const at::Tensor ids = tensor_map("hf/llama_io").at("input0");
  const at::Tensor logits = g::run(expanded, g::local_user_inputs(expanded, {ids}))[0].toTensor();
  EXPECT_TRUE(tensors_close(logits, tensor_map("hf/llama_io").at("output0"), 1e-4, 1e-5));
  const auto [expanded_outputs, expanded_sharded] = norm_outputs_on_sequence_shards(expanded, 1);
  EXPECT_GT(expanded_outputs, 0);
  EXPECT_EQ(expanded_sharded, expanded_outputs) << expanded.str();

  // A joint program records no module paths: refused, not silently unsharded.
  EXPECT_THAT(error_of([&] { g::plan_sequence_parallel(g::load_program(graph_model("hf/llama_joint.pt2")), *m, plan, {.tp_dim = "tp"}); }),
              HasSubstr("plan entry 'model.layers.*.input_layernorm' (SequenceParallel) names model.layers.0.input_layernorm and 1 more, "
                        "but no node of the program records that it ran in them"));
}

// Llama's 2 KV heads over 4 ranks: k_proj and v_proj are replicated (each rank holds all of them), the
// query projection sharded by heads. GPT-2's Conv1D holds its weight [in, out]: column-parallel shards
// dim 1, its packed q/k/v in three strided blocks; row-parallel dim 0.
TEST_F(HuggingFaceTensorParallelTest, EachLayerShardedAsWhatItIs) {
  g::Program llama = g::tensor_parallel_transform(g::load_program(graph_model("hf/llama_train_ir.pt2")), mesh({4}), plan_of("llama"));
  EXPECT_EQ(llama.state.at("model.layers.0.self_attn.q_proj.weight").tensor().sizes(), (at::IntArrayRef{32 / 4, 32}));
  EXPECT_EQ(llama.state.at("model.layers.0.self_attn.k_proj.weight").tensor().sizes(), (at::IntArrayRef{16, 32}));
  EXPECT_EQ(llama.state.at("model.layers.0.mlp.down_proj.weight").tensor().sizes(), (at::IntArrayRef{32, 64 / 4}));
  const int64_t r = world()->rank();
  EXPECT_EQ(llama.state.at("model.embed_tokens.weight").tensor().size(0), r < 3 ? 16 : 14);  // chunks of 62

  g::Program gpt2 = g::tensor_parallel_transform(g::load_program(graph_model("hf/gpt2_train_ir.pt2")), mesh({4}), plan_of("gpt2"));
  const at::Tensor c_attn = g::load_program(graph_model("hf/gpt2_train_ir.pt2")).state.at("transformer.h.0.attn.c_attn.weight").tensor();
  // q, k and v are 32 columns each; rank r holds columns [8r, 8r + 8) of each.
  const at::Tensor want = at::cat({c_attn.slice(1, 8 * r, 8 * r + 8), c_attn.slice(1, 32 + 8 * r, 32 + 8 * r + 8),
                                   c_attn.slice(1, 64 + 8 * r, 64 + 8 * r + 8)}, 1);
  EXPECT_TRUE(at::equal(gpt2.state.at("transformer.h.0.attn.c_attn.weight").tensor(), want));
  EXPECT_EQ(gpt2.state.at("transformer.h.0.mlp.c_fc.weight").tensor().sizes(), (at::IntArrayRef{32, 128 / 4}));
  EXPECT_EQ(gpt2.state.at("transformer.h.0.mlp.c_proj.weight").tensor().sizes(), (at::IntArrayRef{128 / 4, 32}));

  // Mixtral's experts' weights, [expert, out, in], named by the plan themselves: gate/up packed
  // column-parallel (every expert's gate rows [10r, 10r + 10) and up rows [40 + 10r, 40 + 10r + 10)),
  // down row-parallel (every expert's input features [10r, 10r + 10)).
  const std::string mixtral_archive = graph_model("hf/mixtral_train_ir.pt2");
  g::Program mixtral = g::tensor_parallel_transform(g::load_program(mixtral_archive), mesh({4}), plan_of("mixtral"));
  const g::Program whole = g::load_program(mixtral_archive);
  const at::Tensor gate_up = whole.state.at("model.layers.0.mlp.experts.gate_up_proj").tensor();
  EXPECT_TRUE(at::equal(mixtral.state.at("model.layers.0.mlp.experts.gate_up_proj").tensor(),
                        at::cat({gate_up.slice(1, 10 * r, 10 * r + 10), gate_up.slice(1, 40 + 10 * r, 40 + 10 * r + 10)}, 1)));
  EXPECT_TRUE(at::equal(mixtral.state.at("model.layers.0.mlp.experts.down_proj").tensor(),
                        whole.state.at("model.layers.0.mlp.experts.down_proj").tensor().slice(2, 10 * r, 10 * r + 10)));
  EXPECT_EQ(mixtral.state.at("model.layers.0.mlp.gate.weight").tensor().sizes(), (at::IntArrayRef{4, 32}));  // the router: whole
}

// transformers writes one plan for every config of a model type, and skips the entries a config's
// model lacks (Qwen3-MoE's plan names dense MLP layers that a config with no mlp_only_layers has none
// of, and its experts): so does the transform, noting each on the program; strict, it refuses them.
TEST_F(HuggingFaceTensorParallelTest, EntriesMatchingNothingAreSkippedAsTransformersSkipsThem) {
  const std::string extra = R"({"model.layers.*.mlp.experts.gate_up_proj": "packed_colwise", "model.layers.*.mlp.shared_expert.up_proj": "colwise"})";
  ParallelizePlan plan = plan_of("llama");
  for (PlanEntry& e : g::hugging_face_plan(extra)) plan.push_back(std::move(e));
  g::Program local = g::tensor_parallel_transform(g::load_program(graph_model("hf/llama_train_ir.pt2")), mesh({4}), plan);
  EXPECT_TRUE(tensors_close(logits_of(local, "llama"), tensor_map("hf/llama_io").at("output0"), 1e-4, 1e-5));
  EXPECT_EQ(collectives_in(local), kMegatron);
  EXPECT_EQ(local.annotations.program_notes(),
            (std::vector<std::string>{"plan entry 'model.layers.*.mlp.experts.gate_up_proj' matches no module of the program: skipped",
                                      "plan entry 'model.layers.*.mlp.shared_expert.up_proj' matches no module of the program: skipped"}));
  EXPECT_THAT(local.str(), HasSubstr("# plan entry 'model.layers.*.mlp.experts.gate_up_proj' matches no module of the program: skipped\n"));

  for (PlanEntry& e : g::hugging_face_plan(extra, "", "qwen3_moe_tp_plan.json", /*strict=*/true)) plan.push_back(std::move(e));
  EXPECT_THAT(error_of([&] { g::tensor_parallel_transform(g::load_program(graph_model("hf/llama_train_ir.pt2")), mesh({4}), plan); }),
              HasSubstr("plan entry 'model.layers.*.mlp.experts.gate_up_proj' matches no module of the program (its modules: "));
}

TEST_F(HuggingFaceTensorParallelTest, PlansThatDoNotFitAreRefused) {
  auto load = [](const std::string& archive) { return g::load_program(graph_model("hf/" + archive + ".pt2")); };
  // A norm is no layer a graph style shards.
  EXPECT_THAT(error_of([&] { g::tensor_parallel_transform(load("llama_train_ir"), mesh({4}), {{"model.norm", ColwiseParallel{}}}); }),
              HasSubstr("plan entry 'model.norm' matches model.norm (transformers.models.llama.modeling_llama.LlamaRMSNorm), "
                        "whose weight no Linear, Conv1D or Embedding reads"));
  // A container has no weight of its own.
  EXPECT_THAT(error_of([&] { g::tensor_parallel_transform(load("llama_train_ir"), mesh({4}), {{"model.layers.*.mlp", RowwiseParallel{}}}); }),
              HasSubstr("which has no parameter model.layers.0.mlp.weight"));
  // ExpertParallel on a module without experts' 3-d weights.
  EXPECT_THAT(error_of([&] { g::tensor_parallel_transform(load("llama_train_ir"), mesh({4}), {{"model.layers.*.mlp", ExpertParallel{}}}); }),
              HasSubstr("plan entry 'model.layers.*.mlp' (ExpertParallel) matches no module holding experts' 3-d weights"));
  // Mistral's 8 query heads over 3 ranks cannot be spread.
  if (world()->rank() < 3) {
    const MeshPtr three = mesh({3}, {0, 1, 2});
    EXPECT_THAT(error_of([&] { g::tensor_parallel_transform(load("mistral_train_ir"), three, plan_of("mistral")); }),
                HasSubstr("plan entry 'model.layers.*.self_attn.q_proj' shards model.layers.0.self_attn.q_proj, whose output is 8 heads, "
                          "over 3 ranks: the heads cannot be spread"));
  }
}

// SPMD training on the joint graphs (HF's loss pads the labels with constant_pad_nd): the batch
// Shard(0) over "dp" where the mesh has it, the weights by the family's plan over "tp". One step's loss
// and every gradient shard equal PyTorch's eager autograd; 5 AdamW steps follow the whole program
// trained in one process.
struct TrainingLayout {
  std::string name;
  Shape mesh_shape;
  std::vector<std::string> dims;
};

// A TP=4 training step's collectives, Megatron's: forward, the embedding's and each row-parallel
// layer's all-reduce (1 + 2 per layer); backward, one all-reduce of the input gradient per
// column-parallel block (2 per layer) and of lm_head's; the loss's; the logits gathered once. Llama's
// replicated KV heads add none: their gradients come back Partial (each rank's heads' part, padded)
// and join the input gradient's all-reduce. GPT-2's plan leaves its (untied) lm_head replicated: no
// logits to gather, no input gradient to reduce; and its layer norms' backward, folded into
// native_layer_norm_backward (src/graph/fused_backward.h), runs on the all-reduced gradient, so their
// weights' and biases' gradients come out whole, with no bucket of Partial gradients to reduce.
std::map<std::string, int> tp4_step_collectives(const std::string& family) {
  const int megatron_reduces = 1 + 2 * kLayers + 2 * kLayers + 2;
  const std::string reduce = "_c10d_functional::all_reduce", gather = "_c10d_functional::all_gather_into_tensor";
  if (family == "gpt2") return {{reduce, megatron_reduces - 2}};
  return {{reduce, megatron_reduces}, {gather, 1}};
}

class HuggingFaceTraining : public DistTest, public ::testing::WithParamInterface<TrainingLayout> {};

TEST_P(HuggingFaceTraining, EveryFamilyTrainsLikeOneProcess) {
  const TrainingLayout& layout = GetParam();
  const MeshPtr m = mesh(layout.mesh_shape, {}, layout.dims);
  for (const std::string& family : hugging_face_families()) {
    SCOPED_TRACE(family);
    const auto [archive, io, inputs] = hugging_face_joint(family);
    g::Program whole = g::load_program(archive);
    g::SpmdPlacements where;
    Placements batch(m->ndim(), Replicate());
    if (m->ndim() == 2) batch[m->dim_index("dp")] = Shard(0);
    where.user_inputs.assign(2, batch);
    where.state = g::plan_placements(whole, *m, plan_of(family), {.tp_dim = "tp"});
    g::Program step = g::spmd_expand(g::load_program(archive), m, where);
    const auto local_inputs = g::local_user_inputs(step, inputs);
    expect_saves(step, "hf_" + family + "_joint_" + layout.name, local_inputs);

    if (layout.name == "tp4")
      EXPECT_EQ(collectives_in(step), tp4_step_collectives(family)) << g::collectives_report(step);
    expect_joint_step_matches(step, local_inputs, io, m);
    expect_adamw_follows_whole(step, local_inputs, whole, inputs);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HuggingFaceTraining,
                         ::testing::Values(TrainingLayout{"tp4", {4}, {"tp"}}, TrainingLayout{"dp2tp2", {2, 2}, {"dp", "tp"}}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace dtensor::testing
