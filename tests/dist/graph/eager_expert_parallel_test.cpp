// Hugging Face's Mixtral and Qwen3-MoE at module level under expert parallelism: their loss programs
// (forward(input_ids, labels) -> loss, the training IR of scripts/export_hf_models.py: 4 experts, top
// 2, transformers' "batched_mm" experts) run eagerly on DTensors after graph::distribute_program with
// the models' own expert-parallel plans as written, as a PyTorch user runs the eager model after
// parallelize_module; autograd runs the backward. Each rank holds its own experts and runs the
// assignments to them (transformers' expert parallelism: the experts' outputs add up), alone on "ep",
// beside data parallelism on "dp" and beside attention under the tensor-parallel plan on "tp". The loss
// and every gradient equal PyTorch's eager model's, and 5 AdamW steps follow the program trained
// eagerly in one process.

#include <ATen/ATen.h>

#include <algorithm>

#include "../harness.h"
#include "../../support/test_models.h"
#include "dtensor/api.h"
#include "dtensor/comm_debug.h"
#include "dtensor/graph/eager.h"
#include "dtensor/graph/hugging_face.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/tensor_parallel.h"
#include "eager_training.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;
namespace g = dtensor::graph;

const std::map<std::string, int> kMixturesOfExperts = {{"mixtral", 2}, {"qwen3_moe", 1}};  // family, layers of experts

struct EagerEpLayout {
  std::string name;
  Shape mesh_shape;
  std::vector<std::string> dims;
};

bool mesh_has(const DeviceMesh& m, const std::string& dim) {
  return std::find(m.dim_names().begin(), m.dim_names().end(), dim) != m.dim_names().end();
}

// The weights' placements: the experts Shard(0) over "ep" by the model's expert-parallel plan; where
// the mesh has "tp", attention by the model's tensor-parallel plan (its entries outside the MLPs).
std::map<std::string, Placements> weights_placed(const g::Program& program, const DeviceMesh& m, const std::string& family) {
  std::map<std::string, Placements> placed;
  if (mesh_has(m, "tp")) {
    ParallelizePlan attention;
    for (const PlanEntry& e : g::hugging_face_plan(graph_model_text("hf/" + family + "_tp_plan.json"), "", family + "_tp_plan.json"))
      if (e.path.find(".mlp.") == std::string::npos) attention.push_back(e);
    placed = g::plan_placements(program, m, attention, {.tp_dim = "tp"});
  }
  const ParallelizePlan ep = g::hugging_face_ep_plan(graph_model_text("hf/" + family + "_ep_plan.json"), "", family + "_ep_plan.json");
  for (auto& [name, placements] : g::plan_placements(program, m, ep, {.tp_dim = "ep"})) placed[name] = placements;
  return placed;
}

// Each experts op, forward and backward, ran `layers` times with the experts' weights arriving as
// placed (Shard(0) over "ep"), and none of their all-gathers on "ep" moved as many bytes as one rank's
// share of an experts weight (`expert_share_bytes`): the tokens and the routing may travel (eager
// dispatch chooses, op by op, where the tokens are), the experts are never gathered.
void expect_own_experts_only(const CommDebugMode& comm, const DeviceMesh& m, int layers, int64_t expert_share_bytes) {
  const int64_t ep = m.dim_index("ep");
  for (const std::string op : {"dtensor::moe_experts", "dtensor::moe_experts_backward"}) {
    int calls = 0;
    for (const CommDebugMode::OpCall& call : comm.op_calls()) {
      if (call.op != op) continue;
      ++calls;
      const Placements& gate_up = call.inputs[call.inputs.size() - 2];
      EXPECT_EQ(gate_up[static_cast<size_t>(ep)], Placement(Shard(0))) << op;
    }
    EXPECT_EQ(calls, layers) << op << "\n" << comm.summary();
  }
  for (const CommDebugMode::Collective& c : comm.collectives())
    if (c.op.rfind("dtensor::moe_experts", 0) == 0 && c.mesh_dim == ep && c.kind == "all-gather")
      EXPECT_LT(c.bytes, expert_share_bytes) << c.op << " " << c.kind << "\n" << comm.summary();
}

void expect_trains_like_its_eager_model(const std::string& family, int layers, const EagerEpLayout& layout) {
  const MeshPtr m = mesh(layout.mesh_shape, {}, layout.dims);
  const std::string archive = graph_model("hf/" + family + "_loss_train_ir.pt2");
  const auto io = tensor_map("hf/" + family + "_joint_io");
  g::Program model = g::load_program(archive);
  const std::vector<at::Tensor> parameters = g::distribute_program(model, m, weights_placed(model, *m, family));
  int64_t expert_share_bytes = 0;  // one rank's share of the smaller experts weight
  for (int layer = 0; layer < layers; ++layer) {
    const at::Tensor& down = local_tensor_of(model.state.at("model.layers." + std::to_string(layer) + ".mlp.experts.down_proj").tensor());
    EXPECT_EQ(down.size(0), 4 / m->size(m->dim_index("ep")));  // each rank holds its own experts only
    expert_share_bytes = static_cast<int64_t>(down.nbytes());
  }
  Placements batch(m->ndim(), Replicate());  // every rank of "ep" sees every token of its "dp" part
  if (mesh_has(*m, "dp")) batch[m->dim_index("dp")] = Shard(0);
  const std::vector<c10::IValue> inputs = {distribute_tensor(io.at("input0"), m, batch), distribute_tensor(io.at("input1"), m, batch)};
  {
    CommDebugMode comm;
    expect_eager_step_matches(model, parameters, inputs, io);
    expect_own_experts_only(comm, *m, layers, expert_share_bytes);
  }
  g::Program whole = g::load_program(archive);
  expect_eager_adamw_follows_whole(model, parameters, inputs, whole, {io.at("input0"), io.at("input1")});
}

class EagerExpertParallelTest : public DistTest {};

TEST_F(EagerExpertParallelTest, MixtralAndQwen3MoeTrainLikeTheirEagerModels) {
  for (const auto& [family, layers] : kMixturesOfExperts)
    for (const EagerEpLayout& layout : {EagerEpLayout{"ep4", {4}, {"ep"}}, EagerEpLayout{"dp2ep2", {2, 2}, {"dp", "ep"}},
                                        EagerEpLayout{"ep2tp2", {2, 2}, {"ep", "tp"}}}) {
      SCOPED_TRACE(family + " " + layout.name);
      expect_trains_like_its_eager_model(family, layers, layout);
    }
}

TEST_F(EagerExpertParallelTest, PlacementsForStateTheProgramLacksAreRefused) {
  g::Program model = g::load_program(graph_model("hf/mixtral_loss_train_ir.pt2"));
  EXPECT_THAT(error_of([&] { g::distribute_program(model, mesh({4}), {{"model.layers.0.mlp.experts.gate_proj", {Shard(0)}}}); }),
              HasSubstr("distribute_program: placements for 'model.layers.0.mlp.experts.gate_proj', which is not a parameter"));
}

}  // namespace
}  // namespace dtensor::testing
