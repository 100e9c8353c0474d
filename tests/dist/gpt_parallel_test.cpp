// The main job's GPT under its tensor-parallel plans: loss and gradients against the same model on one
// device, the collectives of each layer, and training steps with torch::optim.

#include <ATen/core/grad_mode.h>

#include "dtensor/comm_debug.h"
#include "gpt/training.h"
#include "harness.h"

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

void expect_same_gradients(gpt::Gpt& parallel, gpt::Gpt& reference) {
  const auto expected = reference->named_parameters();
  for (const auto& p : parallel->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    const at::Tensor grad = is_dtensor(p.value()) ? full_tensor(p.value().grad()) : p.value().grad();
    EXPECT_TRUE(tensors_close(grad, expected[p.key()].grad(), 1e-9, 1e-11)) << p.key();
  }
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
  expect_same_gradients(parallel, reference);
}

INSTANTIATE_TEST_SUITE_P(Meshes, GptParallelTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "DP2xTP2" : "TP4"; });

}  // namespace
}  // namespace dtensor::testing
