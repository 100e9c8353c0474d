// Bad input gets a clear DTensorError on every rank, never a hang or a wrong answer.

#include <torch/csrc/distributed/c10d/Backend.hpp>


#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;


class ErrorsTest : public DistTest {};

TEST_F(ErrorsTest, PlacementCountMustMatchMeshDims) {
  auto m = mesh({2, 2});
  const at::Tensor t = at::zeros({4, 4});
  EXPECT_THAT(error_of([&] { distribute_tensor(t, m, Placements{Shard(0)}); }),
              HasSubstr("distribute_tensor: got 1 placement(s) (S(0)) for a mesh with 2 dimension(s)"));
  EXPECT_THAT(error_of([&] { from_local(t, m, {Replicate()}); }), HasSubstr("from_local: got 1 placement(s)"));
  at::Tensor dt = distribute_tensor(t, m);
  EXPECT_THAT(error_of([&] { redistribute(dt, {Replicate(), Replicate(), Replicate()}); }),
              HasSubstr("redistribute: got 3 placement(s)"));
}

TEST_F(ErrorsTest, ShardDimOutOfRange) {
  auto m = mesh({4});
  EXPECT_THAT(error_of([&] { distribute_tensor(at::zeros({4, 4}), m, Placements{Shard(2)}); }),
              HasSubstr("Shard(2) is out of range for a tensor with 2 dimension(s)"));
  EXPECT_THAT(error_of([&] { distribute_tensor(at::zeros({}), m, Placements{Shard(0)}); }),
              HasSubstr("out of range for a tensor with 0 dimension(s)"));
  at::Tensor dt = distribute_tensor(at::zeros({4, 4}), m);
  EXPECT_THAT(error_of([&] { redistribute(dt, {Shard(-3)}); }), HasSubstr("Shard(-3) is out of range"));
}

TEST_F(ErrorsTest, RedistributeToPartialIsRefused) {
  at::Tensor dt = distribute_tensor(at::zeros({4, 4}), mesh({4}), Placements{Shard(0)});
  EXPECT_THAT(error_of([&] { redistribute(dt, {Partial()}); }),
              HasSubstr("cannot move mesh dim 0 from S(0) to P(sum): Partial is a state ops produce"));
}

TEST_F(ErrorsTest, DistributeTensorWantsALeaf) {
  at::Tensor x = at::ones({4}).requires_grad_();
  at::Tensor y = x * 2;
  EXPECT_THAT(error_of([&] { distribute_tensor(y, mesh({4})); }),
              HasSubstr("expects a leaf tensor (such as a parameter) but got the output of MulBackward"));
}

TEST_F(ErrorsTest, DistributeTensorAlreadyDistributedDifferently) {
  at::Tensor dt = distribute_tensor(at::zeros({4, 4}), mesh({4}), Placements{Shard(0)});
  EXPECT_THAT(error_of([&] { distribute_tensor(dt, mesh({4}), Placements{Replicate()}); }),
              HasSubstr("call redistribute(tensor, {R})"));
}

TEST_F(ErrorsTest, FromLocalShapeWithoutStride) {
  FromLocalOptions options;
  options.shape = Shape{8, 4};
  EXPECT_THAT(error_of([&] { from_local(at::zeros({2, 4}), mesh({4}), {Shard(0)}, options); }),
              HasSubstr("got a shape without a stride; pass both"));
  options.run_check = false;
  options.stride = Shape{4, 1};
  options.shape = Shape{9, 4};  // rank 3's shard of 9 rows has 0 rows, not 2
  if (world()->rank() == 3)
    EXPECT_THAT(error_of([&] { from_local(at::zeros({2, 4}), mesh({4}), {Shard(0)}, options); }),
                HasSubstr("is not this rank's shard [0, 4]"));
}

TEST_F(ErrorsTest, RunCheckRanksDisagreeOnReplicaShapes) {
  const int64_t r = world()->rank();
  at::Tensor local = at::zeros({2, r == 1 ? 4 : 3});
  EXPECT_THAT(error_of([&] { from_local(local, mesh({4}), {Replicate()}); }),
              HasSubstr("rank 0 has [2, 3], rank 1 has [2, 4]"));
}

TEST_F(ErrorsTest, RunCheckShardsThatAreNotChunks) {
  const int64_t r = world()->rank();
  const int64_t rows[] = {3, 1, 1, 0};  // torch.chunk of 5 rows over 4 gives 2, 2, 1, 0
  EXPECT_THAT(error_of([&] { from_local(at::zeros({rows[r], 2}), mesh({4}), {Shard(0)}); }),
              HasSubstr("are not torch.chunk pieces"));
}

TEST_F(ErrorsTest, RunCheckFailureInOneGroupReachesEveryRank) {
  // Only the tp group {2, 3} disagrees; ranks 0 and 1 must fail too instead of waiting forever.
  const int64_t r = world()->rank();
  at::Tensor local = at::zeros({2, r == 3 ? 5 : 2});
  const std::string error = error_of([&] { from_local(local, mesh({2, 2}), {Replicate(), Replicate()}); });
  if (r >= 2) EXPECT_THAT(error, HasSubstr("must be equal: rank 2 has [2, 2], rank 3 has [2, 5]"));
  else EXPECT_THAT(error, ::testing::ContainsRegex("rank [23] found local shapes or dtypes that do not fit"));
}

TEST_F(ErrorsTest, CollectiveTimeoutNamesOperationAndMeshDim) {
  MeshOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  options.dim_names = {"tp"};
  auto m = DeviceMesh::create(world(), {4}, options);  // its own groups: this test leaves them broken
  at::Tensor dt = make_dtensor_holding(at::zeros({8, 2}), m, {Shard(0)});
  const std::string gave_up = "errors_test/timeout-gave-up/rank";
  if (world()->rank() == 3) {
    // Rank 3 joins the all-gather only after the others said they gave up (a fixed pause would not do on
    // a loaded machine); it stays alive so they see a timeout, not a reset. Its late call completes
    // what MPI still holds of theirs (Gloo just fails it), so either outcome is right here.
    world()->store()->wait({gave_up + "0", gave_up + "1", gave_up + "2"}, std::chrono::seconds(60));
    try {
      redistribute(dt, {Replicate()});
    } catch (const DTensorError&) {
    }
    return;
  }
  const std::string error = error_of([&] { redistribute(dt, {Replicate()}); });
  world()->store()->set(gave_up + std::to_string(world()->rank()), std::vector<uint8_t>{1});
  EXPECT_THAT(error, HasSubstr("rank " + std::to_string(world()->rank()) + ": all-gather on mesh dim 0 (tp)"));
  EXPECT_THAT(error, HasSubstr("1.5"));
}

}  // namespace
}  // namespace dtensor::testing
