// Gradients through from_local -> redistribute -> to_local (and distribute_tensor / full_tensor),
// compared with the same computation on one device.

#include <torch/csrc/autograd/autograd.h>

#include "harness.h"

namespace dtensor::testing {
namespace {

// The single-device gradient of loss(W) = sum(W^2 * C): 2 W C.
at::Tensor square_weighted_grad(const at::Tensor& w, const at::Tensor& c) { return 2 * w * c; }

class AutogradTest : public DistTest {};

TEST_F(AutogradTest, GradientThroughAllGatherComesBackSharded) {
  const at::Tensor w = test_tensor({5, 4}, at::kDouble, 1), c = test_tensor({5, 4}, at::kDouble, 2);
  for (const auto& m : {mesh({4}), mesh({3}, {0, 1, 2})}) {
    if (!m->contains_this_rank()) continue;
    at::Tensor local = expected_shard(w, m, {Shard(0)}).clone().requires_grad_();
    at::Tensor whole = to_local(redistribute(from_local(local, m, {Shard(0)}), {Replicate()}));
    // Every rank computes the same loss on the whole tensor, so its gradient is Replicate.
    (whole.pow(2) * c).sum().backward();
    EXPECT_TRUE(tensors_close(local.grad(), expected_shard(square_weighted_grad(w, c), m, {Shard(0)})));
  }
}

TEST_F(AutogradTest, GradientThroughAllToAll) {
  const at::Tensor w = test_tensor({6, 7}, at::kDouble, 3), c = test_tensor({6, 7}, at::kDouble, 4);
  auto m = mesh({4});
  at::Tensor local = expected_shard(w, m, {Shard(1)}).clone().requires_grad_();
  at::Tensor rows = to_local(redistribute(from_local(local, m, {Shard(1)}), {Shard(0)}));
  // Each rank's loss covers its rows; together they are the single-device loss.
  (rows.pow(2) * expected_shard(c, m, {Shard(0)})).sum().backward();
  EXPECT_TRUE(tensors_close(local.grad(), expected_shard(square_weighted_grad(w, c), m, {Shard(1)})));
}

TEST_F(AutogradTest, PartialGradPlacementsSumTheRanksLosses) {
  const at::Tensor w = test_tensor({4, 3}, at::kDouble, 5);
  auto m = mesh({4});
  at::Tensor local = expected_shard(w, m, {Shard(0)}).clone().requires_grad_();
  at::Tensor whole = to_local(redistribute(from_local(local, m, {Shard(0)}), {Replicate()}), Placements{Partial()});
  // Rank r's loss is sum(W * C_r): the total loss is sum(W * sum_r C_r).
  const at::Tensor c_mine = test_tensor({4, 3}, at::kDouble, 100 + world()->rank());
  (whole * c_mine).sum().backward();
  at::Tensor c_total = at::zeros({4, 3}, at::kDouble);
  for (int r = 0; r < 4; ++r) c_total += test_tensor({4, 3}, at::kDouble, 100 + r);
  EXPECT_TRUE(tensors_close(local.grad(), expected_shard(c_total, m, {Shard(0)})));
}

// grad_placements whose shard has another shape than the forward's: the local gradient cannot be that
// shard, and backward says so instead of wrapping it with the wrong layout.
TEST_F(AutogradTest, ToLocalGradientOfTheWrongShardShapeIsRefused) {
  auto m = mesh({4});
  at::Tensor dt = distribute_tensor(test_tensor({5, 6}, at::kDouble, 6).requires_grad_(), m, Placements{Shard(0)});
  at::Tensor local = to_local(dt, Placements{Replicate()});  // rows 2, 2, 1, 0: never the whole [5, 6]
  const std::string error = error_of([&] { local.sum().backward(); });
  EXPECT_THAT(error, ::testing::HasSubstr("the gradient of to_local's output has shape [" +
                                          std::to_string(local.size(0)) + ", 6] but the local shard for "
                                          "grad_placements (R) has shape [5, 6]"));
}

TEST_F(AutogradTest, PartialInputsGetTheWholeGradient) {
  // X = reduce_r x_r; loss = sum(X^2 * C). dloss/dx_r = 2 X C for sum, 2 X C / n for avg.
  const at::Tensor x = test_tensor({3, 5}, at::kDouble, 6), c = test_tensor({3, 5}, at::kDouble, 7);
  auto m = mesh({4});
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) {
    at::Tensor contribution = local_tensor_of(make_dtensor_holding(x, m, {Partial(op)})).clone().requires_grad_();
    FromLocalOptions options;
    options.run_check = false;
    at::Tensor whole = full_tensor(from_local(contribution, m, {Partial(op)}, options));
    (whole.pow(2) * c).sum().backward();
    const at::Tensor expected = square_weighted_grad(x, c) / (op == ReduceOp::Avg ? 4 : 1);
    EXPECT_TRUE(tensors_close(contribution.grad(), expected)) << to_string(op);
  }
}

TEST_F(AutogradTest, GradientOnTwoByTwoMesh) {
  const at::Tensor w = test_tensor({5, 6}, at::kDouble, 8), c = test_tensor({5, 6}, at::kDouble, 9);
  auto m = mesh({2, 2});
  const Placements src{Shard(0), Shard(1)}, dst{Replicate(), Shard(0)};
  at::Tensor local = expected_shard(w, m, src).clone().requires_grad_();
  at::Tensor rows = to_local(redistribute(from_local(local, m, src), dst));
  // Replicas along mesh dim 0 compute the same loss; the tp ranks' losses add up to the whole.
  (rows.pow(2) * expected_shard(c, m, dst)).sum().backward();
  EXPECT_TRUE(tensors_close(local.grad(), expected_shard(square_weighted_grad(w, c), m, src)));
}

TEST_F(AutogradTest, LeafDTensorAccumulatesADTensorGradient) {
  const at::Tensor w = test_tensor({6, 2}, at::kFloat, 10), c = test_tensor({6, 2}, at::kFloat, 11);
  auto m = mesh({4});
  at::Tensor param = distribute_tensor(w.clone().requires_grad_(), m, Placements{Shard(0)});
  at::Tensor whole = full_tensor(param);
  (whole.pow(2) * c).sum().backward();
  ASSERT_TRUE(param.grad().defined());
  ASSERT_TRUE(is_dtensor(param.grad()));
  EXPECT_EQ(placements_of(param.grad()), (Placements{Shard(0)}));
  at::NoGradGuard no_grad;
  EXPECT_TRUE(tensors_close(full_tensor(param.grad()), square_weighted_grad(w, c)));
}

TEST_F(AutogradTest, AutogradGradFunctionWorks) {
  const at::Tensor w = test_tensor({4, 4}, at::kDouble, 12);
  auto m = mesh({2, 2});
  at::Tensor local = expected_shard(w, m, {Shard(1), Replicate()}).clone().requires_grad_();
  at::Tensor whole = full_tensor(from_local(local, m, {Shard(1), Replicate()}));
  auto grads = torch::autograd::grad({(whole * whole).sum()}, {local});
  EXPECT_TRUE(tensors_close(grads[0], expected_shard(2 * w, m, {Shard(1), Replicate()})));
}

TEST_F(AutogradTest, BackwardIntoPartialMaxIsRefused) {
  auto m = mesh({4});
  at::Tensor local = at::ones({2, 2}, at::kDouble).requires_grad_();
  FromLocalOptions options;
  options.run_check = false;
  at::Tensor whole = full_tensor(from_local(local, m, {Partial(ReduceOp::Max)}, options));
  try {
    whole.sum().backward();
    ADD_FAILURE() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("Partial(max)"));
  }
}

}  // namespace
}  // namespace dtensor::testing
