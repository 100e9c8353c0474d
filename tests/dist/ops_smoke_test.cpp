// First checks of op dispatch on DTensors against single-device LibTorch.

#include "harness.h"
#include "dtensor/sharding.h"

namespace dtensor::testing {
namespace {

TEST_F(DistTest, MatmulAndPointwiseOnDTensors) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({6, 5}, at::kDouble, 1), w = test_tensor({5, 7}, at::kDouble, 2);
  at::Tensor dx = distribute_tensor(x, m, Placements{Shard(0)});
  at::Tensor dw = distribute_tensor(w, m, Placements{Replicate()});
  at::Tensor y = at::mm(dx, dw);
  EXPECT_EQ(placements_of(y), (Placements{Shard(0)}));
  EXPECT_TRUE(tensors_equal(full_tensor(y), at::mm(x, w)));
  at::Tensor z = at::relu(y + 1) * 2;
  EXPECT_TRUE(tensors_equal(full_tensor(z), at::relu(at::mm(x, w) + 1) * 2));
  // Contracted dim sharded: Partial(sum) output.
  at::Tensor p = at::mm(distribute_tensor(x, m, Placements{Shard(1)}), distribute_tensor(w, m, Placements{Shard(0)}));
  EXPECT_EQ(placements_of(p), (Placements{Partial()}));
  EXPECT_TRUE(tensors_close(full_tensor(p), at::mm(x, w)));
}

TEST_F(DistTest, LinearForwardBackward) {
  auto m = mesh({2, 2});
  const at::Tensor x = test_tensor({8, 6}, at::kDouble, 3), w = test_tensor({5, 6}, at::kDouble, 4),
                   b = test_tensor({5}, at::kDouble, 5);
  at::Tensor dw = distribute_tensor(w.clone().requires_grad_(), m, Placements{Replicate(), Shard(0)});
  at::Tensor db = distribute_tensor(b.clone().requires_grad_(), m, Placements{Replicate(), Shard(0)});
  at::Tensor dx = distribute_tensor(x, m, Placements{Shard(0), Replicate()});
  at::Tensor out = at::linear(dx, dw, db);
  EXPECT_TRUE(tensors_close(full_tensor(out), at::linear(x, w, b)));
}

}  // namespace
}  // namespace dtensor::testing
