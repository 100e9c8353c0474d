// Fully-sharded stages under pipeline schedules (PipelineStage::modules), on a (pp, dp) 2x2 mesh: each
// fully_shard group of a rank's stages reduces its gradients once a step, after its last weight
// backward, however many microbatches and stages hold it (the GPT's root holds the first stage's
// embeddings and the last stage's head, both on pp rank 0 under ZBV), as FSDP2 does under PyTorch's
// schedules. The oracle is the GPT in one process on the whole batch: every gradient of the rank's
// stages equals its, over two steps.

#include <set>

#include "dtensor/comm_debug.h"
#include "dtensor/pipeline.h"
#include "dtensor/pipeline_split.h"
#include "fsdp_gpt.h"
#include "gpt/pipeline.h"

namespace dtensor::testing {
namespace {

namespace pp = dtensor::pipeline;

// The fully_shard groups whose reduce-scatters `comm` saw, in order.
std::vector<std::string> reductions(const CommDebugMode& comm) {
  std::vector<std::string> out;
  for (const auto& c : comm.collectives())
    if (c.kind == "reduce-scatter" && c.op.rfind("fully_shard(", 0) == 0) out.push_back(c.op);
  return out;
}

class PipelineFsdpTest : public DistTest {
 protected:
  // The uneven GPT (2 blocks: pieces tok_emb, blocks.0, blocks.1, lm_head) fully sharded over dp, cut
  // at `split_points` and run by `schedule` over pp.
  void expect_reduces_once_per_step(const pp::Schedule& schedule, const std::vector<std::string>& split_points) {
    const MeshPtr m = mesh({2, 2}, {}, {"pp", "dp"});
    const MeshPtr dp = (*m)["dp"];
    gpt::Gpt model = seeded_uneven_gpt();
    gpt::fully_shard(model, dp);
    const int64_t rank = m->local_rank(0);
    std::vector<pp::PipelineStage> mine;
    std::set<const c10::TensorImpl*> held;
    std::set<const torch::nn::Module*> groups;
    for (auto& stage : pp::split_at(gpt::pipeline_pieces(model), split_points)) {
      if (schedule.rank_of(stage.index) != rank) continue;
      for (const at::Tensor& p : stage.parameters) held.insert(p.unsafeGetTensorImpl());
      for (const auto& module : stage.modules) groups.insert(module.get());
      mine.push_back(std::move(stage));
    }
    pp::PipelineRunner runner(schedule, std::move(mine), m, 0, gpt::pipeline_loss);
    gpt::Gpt reference = seeded_uneven_gpt();
    for (int64_t step = 0; step < 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      reference->zero_grad();
      const gpt::Batch batch = batch_of(step);
      const gpt::Batch rows = dp_rows_of(batch, dp);
      CommDebugMode comm;
      runner.step(rows.tokens, rows.targets);
      const std::vector<std::string> reduced = reductions(comm);
      EXPECT_EQ(reduced.size(), groups.size()) << comm.summary();
      EXPECT_EQ(std::set<std::string>(reduced.begin(), reduced.end()).size(), reduced.size()) << "a group reduced twice\n" << comm.summary();

      gpt::pipeline_loss(reference->logits(batch.tokens), batch.targets).backward();
      const auto expected = reference->named_parameters();
      for (const auto& p : model->named_parameters()) {
        if (!held.count(p.value().unsafeGetTensorImpl())) continue;
        ASSERT_TRUE(p.value().grad().defined()) << p.key();
        EXPECT_TRUE(tensors_close(whole(p.value().grad()), expected[p.key()].grad(), 1e-9, 1e-12)) << p.key();
      }
    }
  }
};

TEST_F(PipelineFsdpTest, OneFOneBReducesEachGroupOncePerStep) { expect_reduces_once_per_step(pp::one_f_one_b(2, 4), {"blocks.1"}); }

TEST_F(PipelineFsdpTest, InterleavedReducesEachGroupOncePerStep) {
  expect_reduces_once_per_step(pp::interleaved_1f1b(2, 2, 4), {"blocks.0", "blocks.1", "lm_head"});
}

// ZBV: pp rank 0 holds stages 0 (tok_emb) and 3 (lm_head), both of the root's group; backward split in
// I and W.
TEST_F(PipelineFsdpTest, ZeroBubbleReducesTheRootSharedByTwoStagesOnce) {
  expect_reduces_once_per_step(pp::zbv_zero_bubble(2, 4), {"blocks.0", "blocks.1", "lm_head"});
}

}  // namespace
}  // namespace dtensor::testing
