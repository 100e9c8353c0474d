// Expert parallelism in graph programs: Hugging Face's Mixtral and Qwen3-MoE (scripts/export_hf_models.py:
// 4 experts, top 2, transformers' "batched_mm" experts; Qwen3-MoE's second layer a dense MLP) with their
// own expert-parallel plans, as transformers writes them. The experts' weights Shard(0) make the graph's experts dtensor's experts ops
// (src/graph/experts_fusion.h): under the tensor-parallel transform the tokens stay whole and each rank
// runs the assignments to its own experts (transformers' expert parallelism); under SPMD expansion with
// the batch sharded over the same dim the tokens travel to their experts by all-to-all (torchtitan's).
// The oracle: PyTorch's logits, loss and gradients on one process, and 5 AdamW steps of the whole joint
// program in one process.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "../harness.h"
#include "expect_saves.h"
#include "joint_step_matches.h"
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

// The mixtures of experts exported, with their layers of experts.
const std::map<std::string, int> kMixtures = {{"mixtral", 2}, {"qwen3_moe", 1}};

ParallelizePlan ep_plan_of(const std::string& family) {
  return g::hugging_face_ep_plan(graph_model_text("hf/" + family + "_ep_plan.json"), "", family + "_ep_plan.json");
}

ParallelizePlan tp_plan_of(const std::string& family) {
  return g::hugging_face_plan(graph_model_text("hf/" + family + "_tp_plan.json"), "", family + "_tp_plan.json");
}

int nodes_calling_op(const g::Program& program, const std::string& op) {
  int n = 0;
  for (const g::Node* node : program.graph.nodes()) n += node->op_name() == op;
  return n;
}

class GraphExpertParallelTest : public DistTest {};

// transformers' way: every rank sees every token, runs the assignments to its experts, and the
// experts' outputs add up: one all-reduce per layer, nothing else.
TEST_F(GraphExpertParallelTest, TheirOwnPlansSpreadTheExpertsInTheForwardPrograms) {
  for (const auto& [family, layers] : kMixtures)
    for (const std::string ir : {"_train_ir", "_aten"}) {
      SCOPED_TRACE(family + ir);
      g::Program local = g::tensor_parallel_transform(g::load_program(graph_model("hf/" + family + ir + ".pt2")), mesh({4}), ep_plan_of(family));
      // Each rank's experts, written out as ATen ops (the graph form): PyTorch loads and runs the program.
      EXPECT_EQ(nodes_calling_op(local, "dtensor::moe_experts"), 0) << local.str();
      EXPECT_EQ(local.state.at("model.layers.0.mlp.experts.gate_up_proj").tensor().size(0), 1);  // one expert per rank
      const auto io = tensor_map("hf/" + family + "_io");
      EXPECT_TRUE(tensors_close(g::run(local, {io.at("input0")})[0].toTensor(), io.at("output0"), 1e-4, 1e-5));
      EXPECT_EQ(collectives_in(local), (std::map<std::string, int>{{"_c10d_functional::all_reduce", layers}})) << g::collectives_report(local);
      expect_saves(local, "hf_" + family + ir + "_ep4", {io.at("input0")});
    }
}

struct EpLayout {
  std::string name;
  Shape mesh_shape;
  std::vector<std::string> dims;
  bool exchange;  // whether the strategy choice takes the all-to-all exchange (else each rank's own experts)
};

// The joint program with the batch Shard(0) over "ep" (and "dp"), the experts over "ep", attention by
// the family's tensor-parallel plan over "tp" where the mesh has it: one step equals PyTorch's, and 5
// AdamW steps follow the whole program in one process. Which dispatch runs is the strategy choice's
// (by bytes moved): the all-to-all on ep4; on the 2-d meshes, at this model's few tokens, gathering
// the tokens over "ep" and adding up each rank's experts (Megatron's all-gather dispatcher), whose
// graph form saves the program for PyTorch.
void expect_trains_like_one_process(const std::string& family, int layers, const EpLayout& layout) {
  const MeshPtr m = mesh(layout.mesh_shape, {}, layout.dims);
  const auto [archive, io, inputs] = hugging_face_joint(family);
  g::Program whole = g::load_program(archive);
  g::SpmdPlacements where;
  Placements batch(m->ndim(), Replicate());
  const auto has = [&](const std::string& dim) {
    return std::find(m->dim_names().begin(), m->dim_names().end(), dim) != m->dim_names().end();
  };
  for (const std::string& dim : {"dp", "ep"})
    if (has(dim)) batch[m->dim_index(dim)] = Shard(0);
  where.user_inputs.assign(2, batch);
  if (has("tp")) {
    ParallelizePlan attention;
    for (const PlanEntry& e : tp_plan_of(family))
      if (e.path.find(".mlp.") == std::string::npos) attention.push_back(e);
    where.state = g::plan_placements(whole, *m, attention, {.tp_dim = "tp"});
  }
  for (auto& [name, placements] : g::plan_placements(whole, *m, ep_plan_of(family), {.tp_dim = "ep"})) where.state[name] = placements;
  g::Program step = g::spmd_expand(g::load_program(archive), m, where);
  const int kernels = layout.exchange ? layers : 0;
  EXPECT_EQ(nodes_calling_op(step, "dtensor::moe_experts"), kernels) << step.str();
  EXPECT_EQ(nodes_calling_op(step, "dtensor::moe_experts_backward"), kernels) << step.str();
  const int64_t experts_here = 4 / m->size(m->dim_index("ep"));
  for (int layer = 0; layer < layers; ++layer)
    EXPECT_EQ(step.state.at("model.layers." + std::to_string(layer) + ".mlp.experts.down_proj").tensor().size(0), experts_here);
  const auto local_inputs = g::local_user_inputs(step, inputs);
  if (!layout.exchange) expect_saves(step, "hf_" + family + "_joint_" + layout.name, local_inputs);
  expect_joint_step_matches(step, local_inputs, io, m);
  expect_adamw_follows_whole(step, local_inputs, whole, inputs);
}

TEST_F(GraphExpertParallelTest, TheirJointProgramsTrainLikeOneProcess) {
  for (const auto& [family, layers] : kMixtures)
    for (const EpLayout& layout : {EpLayout{"ep4", {4}, {"ep"}, true}, EpLayout{"dp2ep2", {2, 2}, {"dp", "ep"}, false},
                                   EpLayout{"ep2tp2", {2, 2}, {"ep", "tp"}, false}}) {
      SCOPED_TRACE(family + " " + layout.name);
      expect_trains_like_one_process(family, layers, layout);
    }
}

TEST_F(GraphExpertParallelTest, ExpertsThatDoNotDivideOverTheRanksAreRefused) {
  if (world()->rank() >= 3) return;
  EXPECT_THAT(error_of([&] { g::tensor_parallel_transform(g::load_program(graph_model("hf/mixtral_train_ir.pt2")), mesh({3}, {0, 1, 2}), ep_plan_of("mixtral")); }),
              HasSubstr("plan entry 'model.layers.*.mlp.experts' (ExpertParallel) spreads the 4 experts of model.layers.0.mlp.experts over 3 "
                        "ranks: they do not divide"));
}

// Each rank running its own experts masks the others' assignments away: an index out of range must not
// pass as one of them.
TEST_F(GraphExpertParallelTest, AnExpertOutOfRangeIsRefusedWhereEachRankRunsItsOwn) {
  const MeshPtr m = mesh({4});
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("dtensor::moe_experts", "").typed<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  const Placements whole{Replicate()}, by_expert{Shard(0)};
  const at::Tensor hidden = distribute_tensor(at::ones({3, 4}, at::kDouble), m, whole);
  const at::Tensor experts = distribute_tensor(at::tensor({0, 1, 2, 7, 3, 1}, at::kLong).reshape({3, 2}), m, whole);
  const at::Tensor weights = distribute_tensor(at::ones({3, 2}, at::kDouble), m, whole);
  const at::Tensor gate_up = distribute_tensor(at::ones({4, 6, 4}, at::kDouble), m, by_expert);
  const at::Tensor down = distribute_tensor(at::ones({4, 4, 3}, at::kDouble), m, by_expert);
  EXPECT_THAT(error_of([&] { op.call(hidden, experts, weights, gate_up, down); }),
              HasSubstr("dtensor::moe_experts': the router chose expert 7, outside [0, 4)"));
}

}  // namespace
}  // namespace dtensor::testing
