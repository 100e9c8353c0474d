// Loss parallelism: cross-entropy over class-sharded logits runs without gathering the logits (only
// all-reduces of per-row values, none in backward), and forward and backward equal single-device
// LibTorch's.

#include <ATen/core/grad_mode.h>

#include <cmath>
#include <limits>

#include "dtensor/comm_debug.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

struct CrossEntropyCase {
  int64_t reduction;
  bool weighted;
  int64_t ignore_index;
};

struct Result {
  at::Tensor loss;
  at::Tensor grad;  // of the logits
};

// 5 samples; targets include the first and the last class and one ignored entry.
at::Tensor targets(int64_t classes, int64_t ignore_index) {
  return at::tensor(std::vector<int64_t>{classes - 1, 0, ignore_index, classes / 2, classes - 1}, at::kLong);
}

Result cross_entropy(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& weight, const CrossEntropyCase& c) {
  at::Tensor loss = at::cross_entropy_loss(logits, target, weight, c.reduction, c.ignore_index);
  (c.reduction == at::Reduction::None ? loss.sum() : loss).backward();
  return {loss, logits.grad()};
}

class LossParallelTest : public DistTest, public ::testing::WithParamInterface<int64_t> {};

// Every reduction, with and without class weights and a custom ignore_index, for 7 classes (2, 2, 2, 1
// over 4 ranks) and 3 classes (1, 1, 1, 0: one rank holds none).
TEST_P(LossParallelTest, ClassShardedCrossEntropyNeverGathersTheLogits) {
  const int64_t classes = GetParam(), rows = 5;
  auto m = mesh({4});
  const at::Tensor x = test_tensor({rows, classes}, at::kDouble, 31) / 2;
  const at::Tensor w = test_tensor({classes}, at::kDouble, 32).abs() + 1;
  for (const CrossEntropyCase c : {CrossEntropyCase{at::Reduction::Mean, false, -100}, CrossEntropyCase{at::Reduction::Mean, true, 1},
                                   CrossEntropyCase{at::Reduction::Sum, true, -100}, CrossEntropyCase{at::Reduction::None, false, 0}}) {
    SCOPED_TRACE("reduction " + std::to_string(c.reduction) + (c.weighted ? ", weighted" : "") + ", ignore_index " +
                 std::to_string(c.ignore_index));
    const at::Tensor t = targets(classes, c.ignore_index);
    const Result expected = cross_entropy(x.clone().requires_grad_(), t, c.weighted ? w : at::Tensor(), c);

    at::Tensor logits = distribute_tensor(x.clone().requires_grad_(), m, Placements{Shard(1)});
    const at::Tensor target = distribute_tensor(t, m), weight = c.weighted ? distribute_tensor(w, m) : at::Tensor();
    Result actual;
    {
      CommDebugMode debug;
      actual = cross_entropy(logits, target, weight, c);
      // The fused cross-entropy: the row max, then the row sums of exponentials with the target
      // logits; backward none. Nothing else, and nothing bigger than two values per row.
      EXPECT_EQ(debug.count("all-reduce"), 2) << debug.summary();
      EXPECT_EQ(debug.total_count(), 2) << debug.summary();
      for (const auto& collective : debug.collectives())
        EXPECT_LE(collective.bytes, 2 * rows * static_cast<int64_t>(sizeof(double))) << debug.summary();
    }
    EXPECT_EQ(placements_of(actual.grad), (Placements{Shard(1)}));
    at::NoGradGuard no_grad;
    EXPECT_TRUE(tensors_close(full_tensor(actual.loss), expected.loss, 1e-12, 1e-12));
    EXPECT_TRUE(tensors_close(full_tensor(actual.grad), expected.grad, 1e-12, 1e-12));
  }
}

INSTANTIATE_TEST_SUITE_P(Classes, LossParallelTest, ::testing::Values(7, 3));

class LossTest : public DistTest {};

// A class masked out with a -inf logit (a vocabulary entry a model must never predict) on a rank that
// holds none of the targets: that rank offers no target logit for those rows, and its -inf must not
// reach the sums as -inf * 0 = NaN.
TEST_F(LossTest, LossParallelWithAMaskedClassIsExact) {
  auto m = mesh({4});
  at::Tensor x = test_tensor({5, 7}, at::kDouble, 35) / 2;
  x.select(1, 2).fill_(-std::numeric_limits<double>::infinity());  // rank 1's first class (2, 2, 2, 1)
  const CrossEntropyCase c{at::Reduction::Mean, false, -100};
  const at::Tensor t = targets(7, c.ignore_index);  // 6, 0, ignored, 3, 6: none of them class 2
  const Result expected = cross_entropy(x.clone().requires_grad_(), t, at::Tensor(), c);
  ASSERT_TRUE(std::isfinite(expected.loss.item<double>()));

  at::Tensor logits = distribute_tensor(x.clone().requires_grad_(), m, Placements{Shard(1)});
  const Result actual = cross_entropy(logits, distribute_tensor(t, m), at::Tensor(), c);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(tensors_close(full_tensor(actual.loss), expected.loss, 1e-12, 1e-12));
  EXPECT_TRUE(tensors_close(full_tensor(actual.grad), expected.grad, 1e-12, 1e-12));
}

// Samples split over one mesh dim and classes over the other: still no gather, and the mean divides
// by the global total weight (one more all-reduce, of that total).
TEST_F(LossTest, LossParallelWithShardedBatchIsExact) {
  auto m = mesh({2, 2});
  const at::Tensor x = test_tensor({5, 7}, at::kDouble, 33) / 2;
  const at::Tensor w = test_tensor({7}, at::kDouble, 34).abs() + 1;
  const CrossEntropyCase c{at::Reduction::Mean, true, 3};
  const at::Tensor t = targets(7, c.ignore_index);
  const Result expected = cross_entropy(x.clone().requires_grad_(), t, w, c);

  at::Tensor logits = distribute_tensor(x.clone().requires_grad_(), m, Placements{Shard(0), Shard(1)});
  const at::Tensor target = distribute_tensor(t, m, Placements{Shard(0), Replicate()}), weight = distribute_tensor(w, m);
  Result actual;
  {
    CommDebugMode debug;
    actual = cross_entropy(logits, target, weight, c);
    EXPECT_EQ(debug.count("all-gather"), 0) << debug.summary();
    EXPECT_EQ(debug.count("all-reduce"), debug.total_count()) << debug.summary();
  }
  EXPECT_EQ(placements_of(actual.grad), (Placements{Shard(0), Shard(1)}));
  at::NoGradGuard no_grad;
  EXPECT_TRUE(tensors_close(full_tensor(actual.loss), expected.loss, 1e-12, 1e-12));
  EXPECT_TRUE(tensors_close(full_tensor(actual.grad), expected.grad, 1e-12, 1e-12));
}

// The fused path's other layouts and the decomposed fallback: a mesh over 3 of the 4 ranks (rank 0
// outside it), per-row losses over a 2-d mesh with the batch sharded, bfloat16 logits (computed in
// float, as Megatron does), and label smoothing (not fused: log_softmax + nll_loss rules).
TEST_F(LossTest, FusedCrossEntropyLayoutsAndFallbackEqualOneDevice) {
  const at::Tensor x = test_tensor({6, 7}, at::kDouble, 35) / 2;
  const at::Tensor t = targets(7, -100).repeat({2}).slice(0, 0, 6);
  struct Case {
    std::string name;
    MeshPtr mesh;
    Placements logits, target;
    int64_t reduction;
    double label_smoothing;
    at::ScalarType dtype;
    double tolerance;
  };
  for (const Case& c : {Case{"3 of 4 ranks", mesh({3}, {1, 2, 3}), {Shard(1)}, {Replicate()}, at::Reduction::Mean, 0.0, at::kDouble, 1e-12},
                        Case{"per row, batch sharded", mesh({2, 2}), {Shard(0), Shard(1)}, {Shard(0), Replicate()}, at::Reduction::None, 0.0, at::kDouble, 1e-12},
                        Case{"bfloat16", mesh({4}), {Shard(1)}, {Replicate()}, at::Reduction::Mean, 0.0, at::kBFloat16, 2e-2},
                        Case{"label smoothing", mesh({4}), {Shard(1)}, {Replicate()}, at::Reduction::Sum, 0.1, at::kDouble, 1e-12}}) {
    SCOPED_TRACE(c.name);
    const auto run = [&](const at::Tensor& logits, const at::Tensor& target) {
      at::Tensor loss = at::cross_entropy_loss(logits, target, {}, c.reduction, -100, c.label_smoothing);
      (c.reduction == at::Reduction::None ? loss.sum() : loss).backward();
      return Result{loss, logits.grad()};
    };
    const Result expected = run(x.to(c.dtype).detach().clone().requires_grad_(), t);
    at::Tensor logits = distribute_tensor(x.to(c.dtype).detach().clone().requires_grad_(), c.mesh, c.logits);
    Result actual;
    {
      CommDebugMode debug;
      actual = run(logits, distribute_tensor(t, c.mesh, c.target));
      EXPECT_EQ(debug.count("all-gather"), 0) << debug.summary();
    }
    if (!c.mesh->contains_this_rank()) continue;
    at::NoGradGuard no_grad;
    EXPECT_EQ(placements_of(actual.grad), c.logits);
    EXPECT_TRUE(tensors_close(full_tensor(actual.loss).to(at::kDouble), expected.loss.to(at::kDouble), c.tolerance, c.tolerance));
    EXPECT_TRUE(tensors_close(full_tensor(actual.grad).to(at::kDouble), expected.grad.to(at::kDouble), c.tolerance, c.tolerance));
  }
}

// A target outside the classes is an error, as in LibTorch, not a quiet loss of log-sum-exp alone.
TEST_F(LossTest, FusedCrossEntropyRefusesTargetsOutOfBounds) {
  const at::Tensor logits = distribute_tensor(test_tensor({3, 7}, at::kDouble, 36), mesh({4}), Placements{Shard(1)});
  const at::Tensor target = distribute_tensor(at::tensor({1, 7, 2}, at::kLong), mesh({4}));
  EXPECT_THAT(error_of([&] { at::cross_entropy_loss(logits, target); }),
              ::testing::HasSubstr("aten::cross_entropy_loss: target 7 is out of bounds for 7 classes"));
  const at::Tensor ignored = distribute_tensor(at::tensor({1, -100, 2}, at::kLong), mesh({4}));
  EXPECT_NO_THROW(at::cross_entropy_loss(logits, ignored));
}

}  // namespace
}  // namespace dtensor::testing
