// Redistribution to another mesh (overlapping, disjoint, other shape), uneven shapes, Partial sources
// and gradients, against the whole tensor on one device.

#include <torch/csrc/autograd/autograd.h>

#include "harness.h"

namespace dtensor::testing {
namespace {

class CrossMeshTest : public DistTest {};

// Moves a DTensor holding `whole` from (from, src) to (to, dst) and checks every rank's shard.
::testing::AssertionResult moves_exactly(const at::Tensor& whole, const MeshPtr& from, const Placements& src,
                                         const MeshPtr& to, const Placements& dst) {
  const at::Tensor x = make_dtensor_holding(whole, from, src, 11);
  const at::Tensor y = redistribute(x, to, dst);
  if (!same_mesh(mesh_of(y), to) || placements_of(y) != dst) return ::testing::AssertionFailure() << describe(y);
  if (y.sizes() != whole.sizes()) return ::testing::AssertionFailure() << "global shape " << y.sizes();
  if (!to->contains_this_rank()) {
    if (local_tensor_of(y).numel() != 0) return ::testing::AssertionFailure() << "a rank outside the target holds data";
    return ::testing::AssertionSuccess();
  }
  return tensors_equal(local_tensor_of(y), expected_shard(whole, to, dst));
}

TEST_F(CrossMeshTest, OverlappingMeshes) {
  const at::Tensor whole = test_tensor({10, 7}, at::kFloat, 1);
  EXPECT_TRUE(moves_exactly(whole, mesh({4}), {Shard(0)}, mesh({2}, {2, 3}), {Shard(1)}));
  EXPECT_TRUE(moves_exactly(whole, mesh({2}, {2, 3}), {Shard(1)}, mesh({4}), {Shard(0)}));
  EXPECT_TRUE(moves_exactly(whole, mesh({3}, {0, 1, 2}), {Shard(1)}, mesh({3}, {1, 2, 3}), {Shard(1)}));
}

TEST_F(CrossMeshTest, DisjointMeshes) {
  const at::Tensor whole = test_tensor({5, 3}, at::kDouble, 2);
  EXPECT_TRUE(moves_exactly(whole, mesh({2}, {0, 1}), {Shard(1)}, mesh({2}, {2, 3}), {Shard(0)}));
  EXPECT_TRUE(moves_exactly(whole, mesh({2}, {0, 1}), {Replicate()}, mesh({2}, {2, 3}), {Shard(1)}));
  EXPECT_TRUE(moves_exactly(test_tensor({}, at::kLong, 3), mesh({1}, {0}), {Replicate()}, mesh({1}, {3}), {Replicate()}));
  EXPECT_TRUE(moves_exactly(at::zeros({0, 4}), mesh({4}), {Shard(1)}, mesh({2}, {2, 3}), {Shard(0)}));
}

TEST_F(CrossMeshTest, TwoDimensionalMeshesAndReplicas) {
  const at::Tensor whole = test_tensor({9, 6}, at::kBFloat16, 4);
  EXPECT_TRUE(moves_exactly(whole, mesh({2, 2}), {Shard(0), Shard(1)}, mesh({3}, {1, 2, 3}), {Shard(0)}));
  EXPECT_TRUE(moves_exactly(whole, mesh({2, 2}), {Shard(1), Replicate()}, mesh({2}, {0, 3}), {Replicate()}));
  EXPECT_TRUE(moves_exactly(whole, mesh({4}), {Shard(1)}, mesh({2, 2}), {Shard(1), Shard(0)}));  // same ranks, other shape
}

TEST_F(CrossMeshTest, PartialSourcesAreReducedFirst) {
  const at::Tensor whole = test_tensor({7, 5}, at::kFloat, 5);
  EXPECT_TRUE(moves_exactly(whole, mesh({2, 2}), {Partial(ReduceOp::Sum), Shard(0)}, mesh({3}, {0, 1, 2}), {Shard(1)}));
  EXPECT_TRUE(moves_exactly(whole, mesh({4}), {Partial(ReduceOp::Max)}, mesh({2}, {2, 3}), {Replicate()}));
}

TEST_F(CrossMeshTest, GradientsFlowBackToTheSourceMesh) {
  const MeshPtr from = mesh({4}), to = mesh({2}, {2, 3});
  const at::Tensor whole = test_tensor({10, 7}, at::kDouble, 6);
  const at::Tensor grad_whole = test_tensor({10, 7}, at::kDouble, 7);
  at::Tensor x = distribute_tensor(whole, from, Placements{Shard(0)}).requires_grad_(true);
  at::Tensor y = redistribute(x, to, {Shard(1)});
  // Every rank of both meshes runs the backward; ranks outside the target pass their empty shard.
  torch::autograd::backward({y}, {distribute_tensor(grad_whole, to, Placements{Shard(1)})});
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(placements_of(x.grad()), Placements{Shard(0)});
  EXPECT_TRUE(tensors_equal(local_tensor_of(x.grad()), expected_shard(grad_whole, from, {Shard(0)})));

  // Through ops on the target mesh: d/dx sum(3 * y) = 3 everywhere.
  at::Tensor x2 = distribute_tensor(whole, from, Placements{Shard(1)}).requires_grad_(true);
  at::Tensor loss = (redistribute(x2, to, {Replicate()}) * 3).sum();
  loss.backward();
  EXPECT_TRUE(tensors_equal(full_tensor(x2.grad()), at::full({10, 7}, 3.0, at::kDouble)));
}

TEST_F(CrossMeshTest, BadTargetsAreRefused) {
  const at::Tensor x = distribute_tensor(test_tensor({4, 4}, at::kFloat, 8), mesh({4}), Placements{Shard(0)});
  EXPECT_THAT(error_of([&] { redistribute(x, mesh({2, 2}), {Shard(0)}); }),
              ::testing::HasSubstr("got 1 placement(s) (S(0)) for a mesh with 2 dimension(s)"));
  EXPECT_THAT(error_of([&] { redistribute(x, mesh({2}, {2, 3}), {Partial(ReduceOp::Sum)}); }),
              ::testing::HasSubstr("on another mesh: Partial is a state ops produce, not a target"));
}

}  // namespace
}  // namespace dtensor::testing
