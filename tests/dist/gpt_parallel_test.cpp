// The main job's GPT under its tensor-parallel plans: loss and gradients against the same model on one
// device, the collectives of each layer, and training steps with torch::optim.

#include <ATen/core/grad_mode.h>

#include "dtensor/comm_debug.h"
#include "gpt/training.h"
#include "harness.h"
#include "test_modules.h"

namespace dtensor::testing {
namespace {

gpt::Config small_config() {
  gpt::Config c;
  c.vocab = 13;  // uneven over 2 and 4 ranks
  c.seq_len = 8;
  c.dim = 16;
  c.heads = 4;
  c.layers = 2;
  c.ffn = 24;
  return c;
}

gpt::Gpt seeded_gpt() {
  torch::manual_seed(11);
  gpt::Gpt model(small_config());
  model->to(at::kDouble);
  return model;
}

gpt::Batch test_batch(int64_t batch) {
  const at::Tensor tokens = at::arange(batch * 9, at::kLong).mul(7).remainder(13).view({batch, 9});
  return {tokens.slice(1, 0, 8).contiguous(), tokens.slice(1, 1, 9).contiguous()};
}

// This rank's rows of a batch split over the mesh's dp dim (the whole batch on a 1-d mesh).
gpt::Batch rows_of(const gpt::Batch& b, const MeshPtr& m) {
  if (m->ndim() == 1) return b;
  const int64_t rows = b.tokens.size(0) / m->size(0), r = (*m->coordinate())[0];
  return {b.tokens.slice(0, r * rows, (r + 1) * rows), b.targets.slice(0, r * rows, (r + 1) * rows)};
}

class GptParallelTest : public DistTest, public ::testing::WithParamInterface<bool> {
 protected:
  MeshPtr parallel_mesh() { return GetParam() ? mesh({2, 2}, {}, {"dp", "tp"}) : mesh({4}, {}, {"tp"}); }
};

TEST_P(GptParallelTest, LossAndGradientsEqualOneDevice) {
  auto m = parallel_mesh();
  auto reference = seeded_gpt(), parallel = seeded_gpt();
  gpt::parallelize(parallel, m);
  const gpt::Batch batch = test_batch(4);
  at::Tensor loss = call(parallel, rows_of(batch, m).tokens, rows_of(batch, m).targets);
  const at::Tensor loss_ref = call(reference, batch.tokens, batch.targets);
  EXPECT_NEAR(gpt::value_of(loss), loss_ref.item<double>(), 1e-10);
  loss.backward();
  loss_ref.backward();
  expect_grads_equal(*parallel, *reference, 1e-9, 1e-11);
}

// Training steps (AdamW, the global-norm clip) on both meshes follow the single-device run.
TEST_P(GptParallelTest, TrainingStepsFollowOneDevice) {
  auto m = parallel_mesh();
  auto reference = seeded_gpt(), parallel = seeded_gpt();
  gpt::parallelize(parallel, m);
  gpt::TrainOptions options;
  options.max_grad_norm = 0.5;  // small enough to clip
  auto optimizer = gpt::make_optimizer(parallel, options);
  auto optimizer_ref = gpt::make_optimizer(reference, options);
  for (int64_t step = 0; step < 3; ++step) {
    const gpt::Batch batch = test_batch(4 + step % 2 * 2);
    const double loss = gpt::train_step(parallel, optimizer, rows_of(batch, m), options);
    const double loss_ref = gpt::train_step(reference, optimizer_ref, batch, options);
    EXPECT_NEAR(loss, loss_ref, 1e-9 * std::abs(loss_ref)) << "step " << step;
  }
  at::NoGradGuard no_grad;
  const auto expected = reference->named_parameters();
  for (const auto& p : parallel->named_parameters()) {
    const at::Tensor value = is_dtensor(p.value()) ? full_tensor(p.value()) : p.value();
    EXPECT_TRUE(tensors_close(value, expected[p.key()], 1e-8, 1e-10)) << p.key();
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, GptParallelTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "DP2xTP2" : "TP4"; });

class ParallelStyleGptTest : public DistTest {};

// Per layer, the Megatron-LM pattern: forward, one all-reduce for the vocabulary-parallel embedding and
// one after each row-parallel layer (attention's wo, the MLP's fc2); backward, one all-reduce per
// column-parallel input (q/k/v together, fc1, the LM head). The fused loss-parallel cross-entropy
// (src/sharding/kernels/loss_parallel.cpp) adds two all-reduces of per-row numbers forward (the max;
// the sums of exponentials with the target logits) and none backward; Megatron's has three forward.
// Nothing is ever gathered.
TEST_F(ParallelStyleGptTest, GptCollectivesFollowMegatron) {
  auto m = mesh({4}, {}, {"tp"});
  auto model = seeded_gpt();
  gpt::parallelize(model, m);
  const gpt::Batch batch = test_batch(4);
  const int64_t layers = small_config().layers;
  CommDebugMode forward;
  at::Tensor loss = call(model, batch.tokens, batch.targets);
  EXPECT_EQ(forward.count("all-reduce"), 1 + 2 * layers + 2) << forward.summary();
  EXPECT_EQ(forward.total_count(), 1 + 2 * layers + 2) << forward.summary();
  CommDebugMode backward;
  loss.backward();
  EXPECT_EQ(backward.count("all-reduce"), 2 * layers + 1) << backward.summary();
  EXPECT_EQ(backward.total_count(), 2 * layers + 1) << backward.summary();
  const int64_t rows = batch.tokens.numel();
  for (const CommDebugMode* mode : {&forward, &backward})
    for (const auto& c : mode->collectives())
      if (c.op != "redistribute") EXPECT_LE(c.bytes, 2 * rows * 8) << mode->summary();  // loss: two doubles per row
  CommDebugMode read;
  gpt::value_of(loss);
  EXPECT_EQ(read.total_count(), 0) << "the fused loss is Replicate: reading it moves nothing";
}

}  // namespace
}  // namespace dtensor::testing
