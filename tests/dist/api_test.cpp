// distribute_tensor, from_local, to_local, full_tensor and the DTensor type, against the full tensor.

#include "harness.h"

namespace dtensor::testing {
namespace {

// Data that differs per rank except on rank 0, so a result equal to rank 0's tensor shows that the
// first rank's data was the truth.
at::Tensor rank_dependent(const at::Tensor& truth) { return truth + 100 * world()->rank(); }

class ApiTest : public DistTest {};

TEST_F(ApiTest, DistributeTensorTakesTheFirstRanksData) {
  const at::Tensor truth = test_tensor({5, 6}, at::kFloat, 7);
  for (const auto& m : {mesh({4}), mesh({2, 2})}) {
    std::vector<Placements> cases = m->ndim() == 1
        ? std::vector<Placements>{{Shard(0)}, {Shard(1)}, {Replicate()}, {Partial()}, {Partial(ReduceOp::Max)}}
        : std::vector<Placements>{{Shard(0), Shard(0)}, {Shard(1), Shard(0)}, {Replicate(), Shard(1)},
                                  {Partial(), Shard(0)}, {Replicate(), Replicate()}};
    for (const auto& placements : cases) {
      SCOPED_TRACE(m->str() + " " + to_string(placements));
      at::Tensor dt = distribute_tensor(rank_dependent(truth), m, placements);
      EXPECT_TRUE(is_dtensor(dt));
      EXPECT_EQ(dt.sizes(), truth.sizes());
      EXPECT_EQ(placements_of(dt), placements);
      if (!spec_of(dt).has_partial()) EXPECT_TRUE(tensors_equal(to_local(dt), expected_shard(truth, m, placements)));
      EXPECT_TRUE(tensors_equal(full_tensor(dt), truth));
    }
  }
}

TEST_F(ApiTest, DistributeTensorDefaultsToReplicateAndKeepsRequiresGrad) {
  const at::Tensor truth = test_tensor({3, 2}, at::kDouble, 3).requires_grad_();
  at::Tensor dt = distribute_tensor(truth, mesh({2, 2}));
  EXPECT_EQ(placements_of(dt), (Placements{Replicate(), Replicate()}));
  EXPECT_TRUE(dt.requires_grad());
  EXPECT_TRUE(dt.is_leaf());
  EXPECT_EQ(dt.strides(), truth.strides());
  // An existing DTensor with the same mesh and placements comes back as is.
  EXPECT_TRUE(distribute_tensor(dt, mesh({2, 2})).is_same(dt));
}

TEST_F(ApiTest, DistributeTensorOnRanksOutsideTheMesh) {
  auto m = mesh({2}, {0, 1});
  at::Tensor dt = distribute_tensor(test_tensor({4, 4}, at::kFloat, 1), m, Placements{Shard(0)});
  EXPECT_EQ(dt.sizes(), (c10::IntArrayRef{4, 4}));
  if (world()->rank() >= 2) EXPECT_EQ(local_tensor_of(dt).numel(), 0);
  else EXPECT_EQ(local_tensor_of(dt).sizes(), (c10::IntArrayRef{2, 4}));
}

TEST_F(ApiTest, FromLocalRunCheckDerivesUnevenGlobalShape) {
  const at::Tensor truth = test_tensor({5, 3}, at::kFloat, 11);
  auto m = mesh({4});
  const Placements s0{Shard(0)};
  at::Tensor dt = from_local(expected_shard(truth, m, s0).clone(), m, s0);  // local rows 2,2,1,0
  EXPECT_EQ(dt.sizes(), truth.sizes());
  EXPECT_TRUE(tensors_equal(full_tensor(dt), truth));

  // A tensor dim sharded over both dims of a 2x2 mesh: rows 5 -> 3,2 -> 2,1,1,1.
  auto m2 = mesh({2, 2});
  const Placements nested{Shard(0), Shard(0)};
  at::Tensor dt2 = from_local(expected_shard(truth, m2, nested).clone(), m2, nested);
  EXPECT_EQ(dt2.sizes(), truth.sizes());
  EXPECT_TRUE(tensors_equal(full_tensor(dt2), truth));
}

TEST_F(ApiTest, FromLocalRunCheckBroadcastsReplicas) {
  const at::Tensor truth = test_tensor({2, 3}, at::kLong, 5);
  at::Tensor local = rank_dependent(truth);
  at::Tensor dt = from_local(local, mesh({4}), {Replicate()});
  EXPECT_TRUE(tensors_equal(to_local(dt), truth));
  EXPECT_TRUE(tensors_equal(local, truth));  // in place: the DTensor shares the caller's memory
}

TEST_F(ApiTest, FromLocalWithoutCheckAssumesEvenShards) {
  at::Tensor local = at::ones({2, 3});
  FromLocalOptions no_check;
  no_check.run_check = false;
  at::Tensor dt = from_local(local, mesh({2, 2}), {Shard(1), Shard(0)}, no_check);
  EXPECT_EQ(dt.sizes(), (c10::IntArrayRef{4, 6}));
  EXPECT_EQ(dt.strides(), (c10::IntArrayRef{6, 1}));
}

TEST_F(ApiTest, FromLocalWithShapeAndStride) {
  const at::Tensor truth = test_tensor({3, 5}, at::kFloat, 2).t();  // non-contiguous: strides (1, 5)
  auto m = mesh({4});
  FromLocalOptions options;
  options.run_check = false;
  options.shape = truth.sizes().vec();
  options.stride = truth.strides().vec();
  at::Tensor dt = from_local(expected_shard(truth, m, {Shard(0)}), m, {Shard(0)}, options);
  EXPECT_EQ(dt.sizes(), truth.sizes());
  EXPECT_EQ(dt.strides(), truth.strides());
  EXPECT_TRUE(tensors_equal(full_tensor(dt), truth));
}

TEST_F(ApiTest, ToLocalSharesMemory) {
  at::Tensor dt = distribute_tensor(at::zeros({4, 2}), mesh({4}), Placements{Shard(0)});
  to_local(dt).fill_(world()->rank());
  EXPECT_TRUE(tensors_equal(full_tensor(dt), at::arange(4, at::kFloat).repeat_interleave(2).view({4, 2})));
}

TEST_F(ApiTest, DescribeShowsShapePlacementsAndMesh) {
  at::Tensor dt = distribute_tensor(at::zeros({4, 6}), mesh({2, 2}, {}, {"dp", "tp"}), Placements{Shard(0), Replicate()});
  EXPECT_EQ(describe(dt),
            "DTensor(shape=[4, 6], dtype=Float, placements=(S(0),R), mesh=DeviceMesh([[0, 1], [2, 3]], names=(dp, tp)), "
            "local=[2, 6])");
  EXPECT_EQ(redistribute_plan(dt, {Replicate(), Shard(1)}).str(),
            "S(0),R -> R,S(1): local chunk on dim 1, then all-gather on dim 0 (24 B/rank)");
}

}  // namespace
}  // namespace dtensor::testing
