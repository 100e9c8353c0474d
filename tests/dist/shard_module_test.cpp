// Sharding plans (seed 004): parameters chunked from a source rank, custom Sharders, output resharding
// and local outputs, and every check of the plan with its error.

#include <ATen/core/grad_mode.h>

#include "dtensor/parallel.h"
#include "dtensor/shard_module.h"
#include "dtensor/sharding.h"
#include "harness.h"
#include "test_modules.h"

namespace dtensor::testing {
namespace {

ChunkShardingSpec chunk(int64_t dim, std::vector<int64_t> ranks = {0, 1, 2, 3}) { return {dim, std::move(ranks)}; }

// Applies ColwiseParallel to the submodule it is given: a Sharder composed from a style.
class ColwiseSharder : public Sharder {
 public:
  void shard(const std::string&, torch::nn::Module& module, const MeshPtr& group) override {
    parallelize_module(module, group, {{"", ColwiseParallel{.use_local_output = false}}});
  }
};

class ShardModuleTest : public DistTest {};

TEST_F(ShardModuleTest, ShardModuleChunksParametersFromTheSourceRankAndReshapesOutputs) {
  auto m = mesh({4});
  auto reference = seeded<TwoLayer>(6, 10);
  auto model = seeded<TwoLayer>(6, 10);
  {
    at::NoGradGuard no_grad;  // only src_rank 1 holds the truth
    if (world()->rank() != 1)
      for (auto& p : model->parameters()) p.add_(100);
  }
  ShardingPlan plan;
  plan.plan = {{"up.weight", chunk(0)}, {"up.bias", chunk(0)}, {"down.weight", chunk(1)}, {"down.bias", chunk(0, {0})}};
  plan.output_plan = {{"down", chunk(0)}};
  plan.return_local_tensor = {"down"};
  shard_module(*model, plan, /*src_rank=*/1, m);
  EXPECT_EQ(placements_of(model->up->weight), (Placements{Shard(0)}));
  EXPECT_EQ(placements_of(model->down->weight), (Placements{Shard(1)}));
  EXPECT_TRUE(model->up->weight.is_leaf() && model->up->weight.requires_grad());
  EXPECT_TRUE(tensors_equal(full_tensor(model->up->weight), reference->up->weight));
  EXPECT_TRUE(tensors_equal(full_tensor(model->down->weight), reference->down->weight));
  // down.bias lives on rank 0 alone (a one-rank spec); it is whole there and empty elsewhere.
  EXPECT_EQ(local_tensor_of(model->down->bias).numel(), world()->rank() == 0 ? 6 : 0);

  // A bias held by one rank cannot be added on all of them: forward gets a replicated one. With 8 rows,
  // the output is resharded by rows (output_plan) and each rank gets its 2 rows back.
  replace_parameter(*model->down, "bias", distribute_tensor(reference->down->bias.detach(), m), "down.bias");
  const at::Tensor x = test_tensor({8, 6}, at::kDouble, 1) / 4;
  at::Tensor y;
  {
    ImplicitReplicationGuard plain_input;
    y = call(model, x);
  }
  EXPECT_FALSE(is_dtensor(y));
  EXPECT_TRUE(tensors_close(y, expected_shard(call(reference, x), m, {Shard(0)}), 1e-10, 1e-12));
}

TEST_F(ShardModuleTest, ShardTensorFollowsTheSpecsRankOrderAndSubsets) {
  auto m = mesh({4});
  const at::Tensor t = test_tensor({7, 3}, at::kFloat, 2);
  const at::Tensor permuted = shard_tensor(t, chunk(0, {3, 1, 0, 2}), 0, m);
  const int64_t position[] = {2, 1, 3, 0};  // where each rank sits in {3, 1, 0, 2}
  EXPECT_TRUE(tensors_equal(local_tensor_of(permuted), t.chunk(4, 0)[position[world()->rank()]]));
  EXPECT_TRUE(tensors_equal(full_tensor(permuted), t));
  const at::Tensor pair = shard_tensor(t, chunk(1, {0, 1}), 0, m);
  if (world()->rank() < 2)
    EXPECT_TRUE(tensors_equal(local_tensor_of(pair), t.chunk(2, 1)[world()->rank()]));
  else
    EXPECT_EQ(local_tensor_of(pair).numel(), 0);
}

TEST_F(ShardModuleTest, ShardModuleRunsCustomShardersAndUsesTheLoadProcessGroup) {
  auto m = mesh({4});
  auto reference = seeded<TwoLayer>(6, 10), model = seeded<TwoLayer>(6, 10);
  ShardingPlan plan;
  plan.plan = {{"up", std::make_shared<ColwiseSharder>()}, {"down.weight", chunk(1)}};
  {
    LoadProcessGroupGuard group(m);
    EXPECT_EQ(LoadProcessGroupGuard::current(), m);
    shard_module(*model, plan);
  }
  EXPECT_EQ(LoadProcessGroupGuard::current(), nullptr);
  EXPECT_EQ(placements_of(model->up->bias), (Placements{Shard(0)}));
  replace_parameter(*model->down, "bias", distribute_tensor(reference->down->bias.detach(), m), "down.bias");
  const at::Tensor x = test_tensor({5, 6}, at::kDouble, 3) / 4;
  const at::Tensor y = call(model, x);
  EXPECT_TRUE(tensors_close(full_tensor(y), call(reference, x), 1e-10, 1e-12));
}

TEST_F(ShardModuleTest, ShardingPlanChecksNameTheProblem) {
  auto m = mesh({4});
  const int64_t rank = world()->rank();
  auto model = seeded<TwoLayer>(6, 10);
  auto plan_of = [](std::string path, ChunkShardingSpec spec) {
    ShardingPlan plan;
    plan.plan = {{std::move(path), std::move(spec)}};
    return plan;
  };
  EXPECT_THAT(error_of([&] { shard_module(*model, plan_of("up.nope", chunk(0)), 0, m); }),
              ::testing::HasSubstr("up.nope: module torch::nn::LinearImpl has no parameter 'nope' (its parameters: weight, bias)"));
  EXPECT_THAT(error_of([&] { shard_module(*model, plan_of("middle.weight", chunk(0)), 0, m); }),
              ::testing::HasSubstr("has no submodule 'middle'"));
  // Every rank sees the disagreement, so none waits for the others.
  EXPECT_THAT(error_of([&] { shard_module(*model, plan_of("up.weight", chunk(0)), rank == 2 ? 1 : 0, m); }),
              ::testing::HasSubstr(rank == 2 ? "src_rank=1 on rank 2 does not match src_rank=0 on rank 0"
                                             : "does not match src_rank=1 on rank 2"));
  EXPECT_THAT(error_of([&] { shard_module(*model, plan_of("up.weight", chunk(rank == 3 ? 1 : 0)), 0, m); }),
              ::testing::HasSubstr("ChunkShardingSpec(dim=1, ranks=[0, 1, 2, 3]) on rank 3"));
  ShardingPlan conflict;
  conflict.plan = {{"up", std::make_shared<ColwiseSharder>()}, {"up.weight", chunk(0)}};
  EXPECT_THAT(error_of([&] { shard_module(*model, conflict, 0, m); }),
              ::testing::HasSubstr("shards parameter up.weight but a Sharder already handles module 'up'"));
  ShardingPlan root_sharder;
  root_sharder.plan = {{"", std::make_shared<ColwiseSharder>()}};
  EXPECT_THAT(error_of([&] { shard_module(*model, root_sharder, 0, m); }),
              ::testing::HasSubstr("a custom Sharder needs a non-empty module path"));
  EXPECT_THAT(error_of([&] { shard_tensor(test_tensor({4, 6}, at::kFloat, 1).t(), chunk(0), 0, m); }),
              ::testing::HasSubstr("not contiguous"));
  EXPECT_THAT(error_of([&] { shard_tensor(test_tensor({4}, at::kFloat, 1), chunk(0)); }),
              ::testing::HasSubstr("no process group given and no LoadProcessGroupGuard active"));
  EXPECT_THAT(error_of([&] { shard_tensor(test_tensor({4}, at::kFloat, 1), chunk(0, {0, 7}), 0, m); }),
              ::testing::HasSubstr("rank 7 is not in DeviceMesh([0, 1, 2, 3])"));
  LoadProcessGroupGuard outer(m);
  EXPECT_THAT(error_of([&] { LoadProcessGroupGuard inner(m); }), ::testing::HasSubstr("guards do not nest"));
}

}  // namespace
}  // namespace dtensor::testing
