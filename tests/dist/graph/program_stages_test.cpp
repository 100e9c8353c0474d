// Hugging Face Llama's programs (scripts/export_hf_models.py: the training IR's forward, and the joint
// forward+backward with its own causal-LM loss) cut into pipeline stages
// (dtensor/graph/program_stages.h) and trained by the pipeline runner between real processes: by its
// own pipeline plan (model.pp_plan as transformers writes it) on the pp dim of a (dp, pp) 2x2 mesh,
// each data-parallel replica its half of the batch; and a stage per layer with 1F1B on 4 ranks, and
// with Interleaved 1F1B (2 stages per rank) on the 2x2 mesh. The oracle is the whole program in one
// process over the same microbatches (the joint program's own backward, which
// tests/unit/program_stages_test.cpp and hugging_face_test.cpp check against PyTorch's eager model),
// with the same AdamW: 5 steps' losses and every parameter after them.

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "../harness.h"
#include "../../support/test_models.h"
#include "dtensor/graph/program_stages.h"
#include "dtensor/graph/training.h"
#include "dtensor/pipeline.h"

namespace dtensor::testing {
namespace {

namespace g = dtensor::graph;
namespace pp = dtensor::pipeline;

constexpr int64_t kSeq = 16, kVocab = 62;  // the exports' (export_hf_models.py)
constexpr int kSteps = 5, kMicrobatches = 4;
constexpr double kLearningRate = 1e-2;

// A program of the exported Llama and what a microbatch of it is: the training IR's forward
// (batch 2, logits), whose loss the test computes, or the joint program (batch 4, its own loss).
struct LlamaProgram {
  std::string archive;
  int64_t batch;
  bool joint() const { return archive.find("joint") != std::string::npos; }
};
const LlamaProgram kForward{"hf/llama_train_ir.pt2", 2}, kJoint{"hf/llama_joint.pt2", 4};

// Hugging Face's causal-LM loss (ForCausalLMLoss, as the joint program computes it): the labels
// shifted left, padded with the ignored index, mean cross-entropy over the logits in float.
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels) {
  const at::Tensor shifted = at::constant_pad_nd(labels, {0, 1}, -100).slice(1, 1);
  return at::cross_entropy_loss(logits.to(at::kFloat).reshape({-1, logits.size(-1)}), shifted.reshape({-1}), {}, at::Reduction::Mean, -100);
}

// Token ids and labels, different in every microbatch, the same on every rank.
struct Batch {
  at::Tensor ids, labels;
};
Batch batch_of(const LlamaProgram& program, int microbatches, int step) {
  at::Generator gen = at::detail::createCPUGenerator(1234 + step);
  return {at::randint(0, kVocab, {microbatches * program.batch, kSeq}, gen, at::kLong),
          at::randint(0, kVocab, {microbatches * program.batch, kSeq}, gen, at::kLong)};
}

// The whole program in one process: per step, the mean of the microbatches' losses and gradients
// (the joint program's own backward; autograd through the forward program), then AdamW. Its
// parameters by name.
struct OneProcess {
  LlamaProgram kind;
  g::Program whole;
  std::map<std::string, at::Tensor> parameters;
  std::vector<double> losses;

  explicit OneProcess(const LlamaProgram& program) : kind(program), whole(g::load_program(graph_model(program.archive))) {
    for (const g::InputSpec& spec : whole.inputs)
      if (spec.kind == g::InputSpec::Kind::Parameter) parameters[spec.target] = whole.state.at(spec.target).tensor();
  }
  // One microbatch's loss; its gradients added to the parameters' (weighing 1 / microbatches).
  double accumulate(const at::Tensor& ids, const at::Tensor& labels, int microbatches) {
    if (!kind.joint()) {
      const at::Tensor loss = causal_lm_loss(g::run(whole, {ids}).at(0).toTensor(), labels);
      (loss / microbatches).backward();
      return loss.item<double>();
    }
    std::map<std::string, at::Tensor> before;
    for (auto& [name, p] : parameters) before[name] = p.grad().defined() ? p.grad().clone() : at::zeros_like(p);
    const double loss = g::joint_step(whole, {ids, labels}).item<double>();  // replaces the gradients
    for (auto& [name, p] : parameters) p.mutable_grad() = before[name] + p.grad() / microbatches;
    return loss;
  }
  void train(int microbatches) {
    std::vector<at::Tensor> trained;
    if (kind.joint()) trained = g::joint_parameters(whole);
    else
      for (const auto& [name, tensor] : g::stage_parameters(whole)) trained.push_back(tensor);
    torch::optim::AdamW adamw(trained, torch::optim::AdamWOptions(kLearningRate));
    for (int step = 0; step < kSteps; ++step) {
      for (auto& [name, p] : parameters) p.mutable_grad() = at::Tensor();
      const Batch b = batch_of(kind, microbatches, step);
      const auto ids = at::chunk(b.ids, microbatches), labels = at::chunk(b.labels, microbatches);
      double loss = 0;
      for (int k = 0; k < microbatches; ++k) loss += accumulate(ids[k], labels[k], microbatches) / microbatches;
      adamw.step();
      losses.push_back(loss);
    }
  }
};

class ProgramStagesPipelineTest : public DistTest {
 protected:
  // Trains `schedule`'s stages of the program split at `points` on `m`'s "pp" dim (each "dp" replica,
  // where the mesh has one, its share of the microbatches, gradients averaged over dp) and compares
  // with one process over all of them.
  void expect_trains_as_one_process(const LlamaProgram& program, const pp::Schedule& schedule, const MeshPtr& m, const std::vector<std::string>& points) {
    const int64_t pp_dim = m->dim_index("pp");
    const bool data_parallel = m->ndim() == 2;
    const int replicas = data_parallel ? static_cast<int>(m->size(m->dim_index("dp"))) : 1;
    const int replica = data_parallel ? static_cast<int>(m->local_rank(m->dim_index("dp"))) : 0;
    const g::ProgramStages parts = g::split_program(g::load_program(graph_model(program.archive)), points);
    ASSERT_EQ(static_cast<int>(parts.stages.size()), schedule.num_stages);
    std::vector<pp::PipelineStage> mine;
    std::map<std::string, at::Tensor> parameters;
    for (int s = 0; s < schedule.num_stages; ++s) {
      if (schedule.rank_of(s) != m->local_rank(pp_dim)) continue;
      mine.push_back(g::pipeline_stage(parts.stages[s], s));
      for (const auto& [name, tensor] : g::stage_parameters(*parts.stages[s])) parameters[name] = tensor;
    }
    std::vector<at::Tensor> to_step;
    for (const auto& [name, p] : parameters) to_step.push_back(p);
    torch::optim::AdamW adamw(to_step, torch::optim::AdamWOptions(kLearningRate));
    pp::PipelineRunner runner(schedule, std::move(mine), m, pp_dim, program.joint() ? g::pipeline_loss(parts.loss) : causal_lm_loss);

    OneProcess oracle(program);
    oracle.train(schedule.num_microbatches * replicas);
    const bool last = schedule.rank_of(schedule.num_stages - 1) == m->local_rank(pp_dim);
    for (int step = 0; step < kSteps; ++step) {
      for (at::Tensor& p : to_step) p.mutable_grad() = at::Tensor();
      const Batch all = batch_of(program, schedule.num_microbatches * replicas, step);
      const auto ids = at::chunk(all.ids, replicas), labels = at::chunk(all.labels, replicas);
      at::Tensor loss = runner.step(ids[replica], labels[replica]);
      if (data_parallel) {
        const MeshPtr dp = (*m)["dp"];
        for (at::Tensor& p : to_step) p.mutable_grad() = to_local(redistribute(from_local(p.grad(), dp, {Partial()}), dp, {Replicate()})) / replicas;
        if (last) loss = to_local(redistribute(from_local(loss, dp, {Partial()}), dp, {Replicate()})) / replicas;
      }
      adamw.step();
      EXPECT_EQ(loss.defined(), last);
      if (last) EXPECT_NEAR(loss.item<double>(), oracle.losses[step], 1e-4 * oracle.losses[step]) << "step " << step;
    }
    EXPECT_FALSE(parameters.empty());
    // AdamW's steps are about the learning rate whatever the gradient's size, so where a gradient is
    // near zero, rounding (the dp average sums in another order) moves a weight by ~1e-5 in 5 steps.
    for (const auto& [name, p] : parameters)
      EXPECT_TRUE(at::allclose(p, oracle.parameters.at(name), 1e-4, 5e-5)) << name << " differs by " << (p - oracle.parameters.at(name)).abs().max().item<double>();
  }
};

// Split by its own pipeline plan, as transformers writes it: the forward program (the loss computed
// on the last stage by the test) and the joint one (its own loss).
TEST_F(ProgramStagesPipelineTest, OwnPlanOnTheDpPpMesh) {
  const MeshPtr m = mesh({2, 2}, {}, {"dp", "pp"});
  for (const LlamaProgram& program : {kForward, kJoint}) {
    SCOPED_TRACE(program.archive);
    const g::Program llama = g::load_program(graph_model(program.archive));
    const auto points = g::pp_plan_split_points(llama, graph_model_text("hf/llama_pp_plan.json"), 2, "", "llama_pp_plan.json");
    expect_trains_as_one_process(program, pp::one_f_one_b(2, kMicrobatches), m, points);
  }
}

TEST_F(ProgramStagesPipelineTest, AStagePerLayer) {
  const std::vector<std::string> every_layer = {"model.layers.0", "model.layers.1", "model.norm"};
  {
    SCOPED_TRACE("1F1B, PP=4");
    expect_trains_as_one_process(kJoint, pp::one_f_one_b(4, kMicrobatches), mesh({4}, {}, {"pp"}), every_layer);
  }
  {
    SCOPED_TRACE("Interleaved 1F1B, PP=2 x DP=2");
    expect_trains_as_one_process(kJoint, pp::interleaved_1f1b(2, 2, kMicrobatches), mesh({2, 2}, {}, {"dp", "pp"}), every_layer);
  }
}

}  // namespace
}  // namespace dtensor::testing
