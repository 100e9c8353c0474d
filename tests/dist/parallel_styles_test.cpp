// Tensor-parallel styles on torch::nn modules: outputs and gradients against the same module on one
// device, and the collectives each style costs (the Megatron-LM pattern).

#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include "dtensor/comm_debug.h"
#include "dtensor/parallel.h"
#include "dtensor/sharding.h"
#include "harness.h"
#include "test_modules.h"

namespace dtensor::testing {
namespace {

class ParallelStyleTest : public DistTest {};

TEST_F(ParallelStyleTest, ColwiseThenRowwiseLinearIsMegatronsMlp) {
  auto m = mesh({4});
  auto reference = seeded<TwoLayer>(6, 10);  // hidden 10 over 4 ranks: uneven shards 3, 3, 2, 2
  auto parallel = seeded<TwoLayer>(6, 10);
  parallelize_module(*parallel, m, {{"up", ColwiseParallel{}}, {"down", RowwiseParallel{}}});
  EXPECT_EQ(placements_of(parallel->up->weight), (Placements{Shard(0)}));
  EXPECT_EQ(placements_of(parallel->up->bias), (Placements{Shard(0)}));
  EXPECT_EQ(placements_of(parallel->down->weight), (Placements{Shard(1)}));
  EXPECT_EQ(placements_of(parallel->down->bias), (Placements{Replicate()}));

  const at::Tensor x = test_tensor({5, 6}, at::kDouble, 1).requires_grad_();
  const at::Tensor x_ref = x.detach().clone().requires_grad_();
  CommDebugMode forward;
  at::Tensor y = call(parallel, x);
  EXPECT_EQ(forward.count("all-reduce"), 1) << forward.summary();
  EXPECT_EQ(forward.total_count(), 1) << forward.summary();
  EXPECT_FALSE(is_dtensor(y));  // use_local_output
  const at::Tensor y_ref = call(reference, x_ref);
  EXPECT_TRUE(tensors_close(y, y_ref, 1e-10, 1e-12));

  CommDebugMode backward;
  (y * y).sum().backward();
  // The input's gradient is the one all-reduce (Megatron's f); the weights' need none.
  EXPECT_EQ(backward.count("all-reduce"), 1) << backward.summary();
  EXPECT_EQ(backward.total_count(), 1) << backward.summary();
  (y_ref * y_ref).sum().backward();
  EXPECT_TRUE(tensors_close(x.grad(), x_ref.grad(), 1e-10, 1e-12));
  expect_grads_equal(*parallel, *reference);
}

TEST_F(ParallelStyleTest, RowwiseEmbeddingIsVocabularyParallel) {
  auto m = mesh({4});
  auto make = [] {
    torch::manual_seed(3);
    torch::nn::Embedding e(11, 6);  // vocabulary 11 over 4 ranks: 3, 3, 3, 2
    e->to(at::kDouble);
    return e;
  };
  auto reference = make(), parallel = make();
  parallelize_module(*parallel, m, {{"", RowwiseParallel{}}});
  EXPECT_EQ(placements_of(parallel->weight), (Placements{Shard(0)}));
  const at::Tensor ids = at::tensor({0, 10, 3, 7, 7, 2, 9, 5}, at::kLong).view({2, 4});
  CommDebugMode debug;
  const at::Tensor y = call(parallel, ids);
  EXPECT_EQ(debug.count("all-reduce"), 1) << debug.summary();
  EXPECT_EQ(debug.total_count(), 1) << debug.summary();
  const at::Tensor y_ref = reference(ids);
  EXPECT_TRUE(tensors_close(y, y_ref, 1e-12, 1e-12));
  y.pow(3).sum().backward();
  y_ref.pow(3).sum().backward();
  expect_grads_equal(*parallel, *reference);
}

TEST_F(ParallelStyleTest, ColwiseEmbeddingShardsTheEmbeddingDim) {
  auto m = mesh({4});
  torch::manual_seed(4);
  torch::nn::Embedding reference(9, 7);
  torch::manual_seed(4);
  torch::nn::Embedding parallel(9, 7);
  parallelize_module(*parallel, m, {{"", ColwiseParallel{.use_local_output = false}}});
  EXPECT_EQ(placements_of(parallel->weight), (Placements{Shard(1)}));
  const at::Tensor ids = at::tensor({8, 0, 4, 4, 1}, at::kLong);
  CommDebugMode debug;
  const at::Tensor y = call(parallel, ids);
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  EXPECT_EQ(placements_of(y), (Placements{Shard(1)}));
  EXPECT_TRUE(tensors_close(full_tensor(y), reference(ids)));
}

// Norm (sequence parallel) -> colwise -> rowwise back to sequence-sharded: Megatron's sequence
// parallelism, one all-gather before the colwise layer and one reduce-scatter after the rowwise one.
class NormMlpImpl : public torch::nn::Module {
 public:
  NormMlpImpl(int64_t dim, int64_t hidden)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        mlp(register_module("mlp", TwoLayer(dim, hidden))) {}
  at::Tensor forward(const at::Tensor& x) { return call(mlp, call(norm, x)); }
  torch::nn::LayerNorm norm;
  TwoLayer mlp;
};
TORCH_MODULE(NormMlp);

TEST_F(ParallelStyleTest, SequenceParallelGathersBeforeColwiseAndReduceScattersAfterRowwise) {
  auto m = mesh({4});
  auto reference = seeded<NormMlp>(6, 10), parallel = seeded<NormMlp>(6, 10);
  {
    at::NoGradGuard no_grad;  // a norm that is not the identity
    reference->norm->weight.copy_(test_tensor({6}, at::kDouble, 2) / 4 + 1);
    parallel->norm->weight.copy_(test_tensor({6}, at::kDouble, 2) / 4 + 1);
  }
  parallelize_module(*parallel, m,
                     {{"norm", SequenceParallel{}},
                      {"mlp.up", ColwiseParallel{.input_layout = Shard(1)}},
                      {"mlp.down", RowwiseParallel{.output_layout = Shard(1), .use_local_output = false}}});
  EXPECT_EQ(placements_of(parallel->norm->weight), (Placements{Replicate()}));
  const at::Tensor x = test_tensor({2, 8, 6}, at::kDouble, 3) / 4;
  const at::Tensor x_local = expected_shard(x, m, {Shard(1)});  // this rank's part of the sequence
  CommDebugMode forward;
  at::Tensor y = call(parallel, x_local);
  EXPECT_EQ(forward.count("all-gather"), 1) << forward.summary();
  EXPECT_EQ(forward.count("reduce-scatter"), 1) << forward.summary();
  EXPECT_EQ(forward.total_count(), 2) << forward.summary();
  EXPECT_EQ(placements_of(y), (Placements{Shard(1)}));
  const at::Tensor y_ref = call(reference, x);
  EXPECT_TRUE(tensors_close(full_tensor(y), y_ref, 1e-10, 1e-12));
  y.sum().backward();
  y_ref.sum().backward();
  expect_grads_equal(*parallel, *reference);
}

TEST_F(ParallelStyleTest, ColwiseLmHeadFeedsLossParallelCrossEntropyWithoutGatheringLogits) {
  auto m = mesh({4});
  auto make = [] {
    torch::manual_seed(5);
    torch::nn::Linear head(6, 13);  // 13 classes over 4 ranks
    head->to(at::kDouble);
    return head;
  };
  auto reference = make(), parallel = make();
  parallelize_module(*parallel, m, {{"", ColwiseParallel{.use_local_output = false}}});
  const at::Tensor x = test_tensor({5, 6}, at::kDouble, 6) / 8;
  const at::Tensor target = at::tensor({12, 0, 5, 3, 9}, at::kLong);
  CommDebugMode debug;
  at::Tensor loss;
  {
    ImplicitReplicationGuard plain_target;
    loss = torch::nn::functional::cross_entropy(call(parallel, x), target);
  }
  EXPECT_EQ(debug.count("all-gather"), 0) << debug.summary();
  // Per-row numbers only: the row max, then the row sums and target logits together.
  for (const auto& c : debug.collectives()) EXPECT_LE(c.bytes, 2 * 5 * 8) << debug.summary();
  const at::Tensor loss_ref = torch::nn::functional::cross_entropy(reference(x), target);
  EXPECT_TRUE(tensors_close(full_tensor(loss), loss_ref, 1e-10, 1e-12));
  {
    ImplicitReplicationGuard plain_target;  // backward meets the saved plain target again
    loss.backward();
  }
  loss_ref.backward();
  expect_grads_equal(*parallel, *reference);
}

// PrepareModuleInput / PrepareModuleOutput on a module no style knows: a row-sharded batch is gathered
// on entry, and the output is handed back as this rank's rows.
TEST_F(ParallelStyleTest, PrepareModuleInputAndOutputConvertAtTheBoundary) {
  auto m = mesh({4});
  auto reference = seeded<TwoLayer>(6, 10), parallel = seeded<TwoLayer>(6, 10);
  parallelize_module(*parallel, m,
                     {{"", PrepareModuleInput{{Shard(0)}, {Replicate()}}},
                      {"", PrepareModuleOutput{.output_layout = Replicate(), .desired_output_layout = Shard(0)}}});
  distribute_module(*parallel, m);  // parameters Replicate, so they meet the DTensor input
  const at::Tensor x = test_tensor({8, 6}, at::kDouble, 8) / 4;
  CommDebugMode debug;
  const at::Tensor y = call(parallel, expected_shard(x, m, {Shard(0)}));
  EXPECT_EQ(debug.count("all-gather"), 1) << debug.summary();
  EXPECT_EQ(debug.total_count(), 1) << debug.summary();
  EXPECT_FALSE(is_dtensor(y));
  EXPECT_TRUE(tensors_close(y, expected_shard(call(reference, x), m, {Shard(0)}), 1e-10, 1e-12));
}

// PrepareModuleInputOutput is both conversions on one plan entry: the same boundary as above, with the
// input handed to forward as this rank's local tensor (use_local_input) and the output a DTensor.
TEST_F(ParallelStyleTest, PrepareModuleInputOutputConvertsBothWays) {
  auto m = mesh({4});
  auto reference = seeded<TwoLayer>(6, 10), parallel = seeded<TwoLayer>(6, 10);
  parallelize_module(*parallel, m,
                     {{"", PrepareModuleInputOutput{.input = {{Shard(0)}, {Replicate()}, /*use_local_output=*/true},
                                                    .output = {.output_layout = Replicate(),
                                                               .desired_output_layout = Shard(0),
                                                               .use_local_output = false}}}});
  const at::Tensor x = test_tensor({8, 6}, at::kDouble, 9) / 4;  // plain shards are read as even ones
  CommDebugMode debug;
  const at::Tensor y = call(parallel, expected_shard(x, m, {Shard(0)}));
  EXPECT_EQ(debug.count("all-gather"), 1) << debug.summary();
  EXPECT_EQ(debug.total_count(), 1) << debug.summary();
  ASSERT_TRUE(is_dtensor(y));
  EXPECT_EQ(placements_of(y), (Placements{Shard(0)}));
  EXPECT_TRUE(tensors_close(full_tensor(y), call(reference, x), 1e-10, 1e-12));
}

}  // namespace
}  // namespace dtensor::testing
