// Reductions, normalisation and softmax on DTensors: the placements they produce, the collectives
// they cost (CommDebugMode), and exactness where uneven shards could skew a naive result.

#include "dtensor/comm_debug.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

at::Tensor x86() { return test_tensor({8, 6}, at::kDouble, 11); }

class ReductionTest : public DistTest {};

TEST_F(ReductionTest, SumOverShardedDimThenFullTensorIsOneAllReduce) {
  at::Tensor x = distribute_tensor(x86(), mesh({4}), Placements{Shard(0)});
  CommDebugMode debug;
  at::Tensor y = x.sum(0);
  EXPECT_EQ(placements_of(y), (Placements{Partial()}));
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  at::Tensor whole = full_tensor(y);
  EXPECT_EQ(debug.total_count(), 1) << debug.summary();
  EXPECT_EQ(debug.count("all-reduce"), 1);
  EXPECT_TRUE(tensors_equal(whole, x86().sum(0)));
}

TEST_F(ReductionTest, SumOverUnshardedDimKeepsTheShard) {
  at::Tensor x = distribute_tensor(test_tensor({2, 5, 6}, at::kDouble, 12), mesh({4}), Placements{Shard(1)});
  CommDebugMode debug;
  at::Tensor y = x.sum({0, 2});
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  EXPECT_EQ(placements_of(y), (Placements{Shard(0)}));
}

TEST_F(ReductionTest, MeanOverUnevenShardsIsExact) {
  // 6 rows over 4 ranks: shards of 2, 2, 2 and 0 rows. Every rank contributes its local sum over the
  // global count (multiples of 6 here, so every step is exact), not its local mean.
  const at::Tensor full = test_tensor({6, 5}, at::kDouble, 13) * 6;
  at::Tensor x = distribute_tensor(full, mesh({4}), Placements{Shard(0)});
  CommDebugMode debug;
  at::Tensor y = x.mean(0);
  EXPECT_EQ(placements_of(y), (Placements{Partial()}));
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  EXPECT_TRUE(tensors_equal(full_tensor(y), full.mean(0)));
  EXPECT_TRUE(tensors_equal(full_tensor(x.mean()), full.mean()));
}

TEST_F(ReductionTest, MeanOverBothMeshDimsOfUnevenShards) {
  const at::Tensor full = test_tensor({5, 7}, at::kDouble, 14);
  at::Tensor x = distribute_tensor(full, mesh({2, 2}), Placements{Shard(0), Shard(1)});
  at::Tensor y = x.mean();
  EXPECT_EQ(placements_of(y), (Placements{Partial(), Partial()}));
  EXPECT_TRUE(tensors_close(full_tensor(y), full.mean(), 1e-15, 1e-15));
}

TEST_F(ReductionTest, AmaxOverShardedDimIsPartialMaxEvenWithAnEmptyShard) {
  // 3 rows over 4 ranks: the last shard is empty and contributes max's identity.
  const at::Tensor full = test_tensor({3, 4}, at::kDouble, 15);
  at::Tensor x = distribute_tensor(full, mesh({4}), Placements{Shard(0)});
  CommDebugMode debug;
  at::Tensor y = x.amax(0);
  EXPECT_EQ(placements_of(y), (Placements{Partial(ReduceOp::Max)}));
  at::Tensor whole = full_tensor(y);
  EXPECT_EQ(debug.count("all-reduce"), 1) << debug.summary();
  EXPECT_TRUE(tensors_equal(whole, full.amax(0)));
  EXPECT_TRUE(tensors_equal(full_tensor(x.min()), full.min()));
}

TEST_F(ReductionTest, VectorNormOverShardsIsOneAllReducePerMeshDim) {
  const at::Tensor full = test_tensor({7, 5}, at::kDouble, 16);
  at::Tensor x = distribute_tensor(full, mesh({2, 2}), Placements{Shard(0), Shard(1)});
  CommDebugMode debug;
  at::Tensor n = at::linalg_vector_norm(x);
  EXPECT_EQ(placements_of(n), (Placements{Replicate(), Replicate()}));
  EXPECT_EQ(debug.total_count(), 2) << debug.summary();
  EXPECT_EQ(debug.count("all-reduce"), 2);
  EXPECT_TRUE(tensors_close(full_tensor(n), at::linalg_vector_norm(full), 1e-12, 1e-12));
}

TEST_F(ReductionTest, MaxDimOverShardedDimGivesGlobalIndices) {
  const at::Tensor full = test_tensor({7, 5}, at::kDouble, 17);
  at::Tensor x = distribute_tensor(full, mesh({4}), Placements{Shard(0)});
  auto [values, indices] = x.max(0);
  auto [expected_values, expected_indices] = full.max(0);
  EXPECT_TRUE(tensors_equal(full_tensor(values), expected_values));
  EXPECT_TRUE(tensors_equal(full_tensor(indices), expected_indices));
  EXPECT_TRUE(tensors_equal(full_tensor(x.argmin(0)), full.argmin(0)));
}

TEST_F(ReductionTest, SoftmaxKeepsShardsOfOtherDimsWithoutCommunication) {
  const at::Tensor full = test_tensor({5, 6}, at::kDouble, 18);
  at::Tensor x = distribute_tensor(full, mesh({4}), Placements{Shard(0)});
  CommDebugMode debug;
  at::Tensor y = at::softmax(x, 1);
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  EXPECT_EQ(placements_of(y), (Placements{Shard(0)}));
  EXPECT_TRUE(tensors_close(full_tensor(y), at::softmax(full, 1), 1e-12, 1e-12));
}

TEST_F(ReductionTest, LayerNormWithShardedBatchGivesPartialParameterGradients) {
  const at::Tensor full = test_tensor({5, 6}, at::kDouble, 19);
  const at::Tensor w = test_tensor({6}, at::kDouble, 20), b = test_tensor({6}, at::kDouble, 21);
  auto m = mesh({4});
  at::Tensor x = distribute_tensor(full.clone().requires_grad_(), m, Placements{Shard(0)});
  at::Tensor dw = distribute_tensor(w.clone().requires_grad_(), m), db = distribute_tensor(b.clone().requires_grad_(), m);
  at::Tensor y = at::layer_norm(x, {6}, dw, db);
  EXPECT_EQ(placements_of(y), (Placements{Shard(0)}));
  {
    CommDebugMode debug;
    y.sum().backward();
    EXPECT_EQ(debug.total_count(), 0) << debug.summary();
    EXPECT_EQ(placements_of(dw.grad()), (Placements{Partial()}));
    EXPECT_EQ(placements_of(db.grad()), (Placements{Partial()}));
    EXPECT_EQ(placements_of(x.grad()), (Placements{Shard(0)}));
  }
  at::Tensor fx = full.clone().requires_grad_(), fw = w.clone().requires_grad_(), fb = b.clone().requires_grad_();
  at::layer_norm(fx, {6}, fw, fb).sum().backward();
  EXPECT_TRUE(tensors_close(full_tensor(dw.grad()), fw.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(tensors_close(full_tensor(db.grad()), fb.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(tensors_close(full_tensor(x.grad()), fx.grad(), 1e-12, 1e-12));
}

}  // namespace
}  // namespace dtensor::testing
