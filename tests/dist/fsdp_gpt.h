#pragma once
// The main job's GPT as the fully_shard tests use it: sizes whose rows do not divide over 4 ranks,
// seeded alike on every rank, its batches, and the one-device oracle of its training.

#include "dtensor/fsdp.h"
#include "gpt/training.h"
#include "harness.h"

namespace dtensor::testing {

// Rows of tok_emb and lm_head (13), fc1 (22) and pos_emb (9) are uneven over 4 ranks.
inline gpt::Config uneven_config(int64_t layers = 2) {
  return {.vocab = 13, .seq_len = 9, .dim = 12, .heads = 4, .layers = layers, .ffn = 22};
}

inline gpt::Gpt seeded_uneven_gpt(at::ScalarType dtype = at::kDouble, int64_t layers = 2) {
  torch::manual_seed(5);
  gpt::Gpt model(uneven_config(layers));
  model->to(dtype);
  return model;
}

inline gpt::Batch batch_of(int64_t step, int64_t rows = 8) {
  const at::Tensor tokens = at::arange(rows * 10, at::kLong).mul(7 + step).add(step).remainder(13).view({rows, 10});
  return {tokens.slice(1, 0, 9).contiguous(), tokens.slice(1, 1, 10).contiguous()};
}

// This rank's rows of `batch` over the 1-d data-parallel mesh `m`.
inline gpt::Batch dp_rows_of(const gpt::Batch& batch, const MeshPtr& m) {
  const int64_t rows = batch.tokens.size(0) / m->size(), r = (*m->coordinate())[0];
  return {batch.tokens.slice(0, r * rows, (r + 1) * rows), batch.targets.slice(0, r * rows, (r + 1) * rows)};
}

inline at::Tensor whole(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t) : t; }

inline void expect_parameters_equal(gpt::Gpt& parallel, gpt::Gpt& reference, double rtol, double atol) {
  at::NoGradGuard no_grad;
  const auto expected = reference->named_parameters();
  for (const auto& p : parallel->named_parameters())
    EXPECT_TRUE(tensors_close(whole(p.value()), expected[p.key()], rtol, atol)) << p.key();
}

// Three AdamW steps with the global-norm clip, each rank on its rows of the batch: the whole batch's
// losses and, at the end, the parameters of one device's training.
inline void expect_training_follows_one_device(gpt::Gpt& parallel, gpt::Gpt& reference, const MeshPtr& dp) {
  gpt::TrainOptions options;
  options.max_grad_norm = 0.5;  // small enough to clip
  auto optimizer = gpt::make_optimizer(parallel, options);
  auto optimizer_ref = gpt::make_optimizer(reference, options);
  for (int64_t step = 0; step < 3; ++step) {
    const gpt::Batch batch = batch_of(step, 2 * dp->size());
    const double loss = gpt::mean_over(dp, gpt::train_step(parallel, optimizer, dp_rows_of(batch, dp), options));
    const double loss_ref = gpt::train_step(reference, optimizer_ref, batch, options);
    EXPECT_NEAR(loss, loss_ref, 1e-9 * std::abs(loss_ref)) << "step " << step;
  }
  expect_parameters_equal(parallel, reference, 1e-8, 1e-10);
}

}  // namespace dtensor::testing
