// DTensor factories (zeros, ones, empty, full, rand, randn) and random ops on DTensors, against the
// same calls on one device with the same generator seed.

#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <thread>

#include "dtensor/comm_debug.h"
#include "dtensor/sharding.h"

#include "random_layouts.h"

namespace dtensor::testing {
namespace {

class FactoryRandomTest : public DistTest {};

TEST_F(FactoryRandomTest, FactoriesMakeTheWholeTensorFromLocalShards) {
  const Shape shape = {5, 3};
  for (const auto& [m, p] : layouts_2d()) {
    SCOPED_TRACE(describe(m, p));
    const auto options = at::TensorOptions().dtype(at::kDouble);
    at::Tensor z = zeros(shape, m, p, options), o = ones(shape, m, p, options);
    at::Tensor f = full(shape, 2.5, m, p, options), e = empty(shape, m, p, options);
    for (const auto& t : {z, o, f, e}) {
      EXPECT_EQ(placements_of(t), p);
      EXPECT_EQ(t.sizes(), (c10::IntArrayRef{5, 3}));
      EXPECT_EQ(t.scalar_type(), at::kDouble);
    }
    if (!has_partial(p)) EXPECT_EQ(local_tensor_of(o).sizes(), expected_shard(at::ones(shape), m, p).sizes());
    EXPECT_TRUE(tensors_equal(full_tensor(z), at::zeros(shape, options)));
    EXPECT_TRUE(tensors_equal(full_tensor(o), at::ones(shape, options)));
    EXPECT_TRUE(tensors_equal(full_tensor(f), at::full(shape, 2.5, options)));
  }
}

// 7 points over 4 ranks (2, 2, 2, 1), over 2x2 twice along the one dim, Partial included: the values of
// at::linspace / at::logspace to the bit.
TEST_F(FactoryRandomTest, LinspaceAndLogspaceAreOneDevicesLines) {
  const auto options = at::TensorOptions().dtype(at::kDouble);
  const std::vector<std::pair<MeshPtr, Placements>> layouts = {{mesh({4}), {Shard(0)}},
                                                               {mesh({4}), {Replicate()}},
                                                               {mesh({2, 2}), {Shard(0), Shard(0)}},
                                                               {mesh({2, 2}), {Partial(), Shard(0)}}};
  for (const auto& [m, p] : layouts) {
    SCOPED_TRACE(describe(m, p));
    const at::Tensor line = linspace(-1.5, 2.0, 7, m, p, options), powers = logspace(-1, 3, 7, 2.0, m, p, options);
    EXPECT_EQ(placements_of(line), p);
    EXPECT_TRUE(at::equal(full_tensor(line), at::linspace(-1.5, 2.0, 7, options)));
    EXPECT_TRUE(at::equal(full_tensor(powers), at::logspace(-1, 3, 7, 2.0, options)));
  }
  EXPECT_EQ(linspace(0, 1, 0, mesh({4}), Placements{Shard(0)}).numel(), 0);
  EXPECT_THAT(error_of([&] { linspace(0, 1, -2, mesh({4})); }), ::testing::HasSubstr("steps must be >= 0"));
  for (const Placement& runs : {StridedShard(0, 2), HeadTailShard(0)})
    EXPECT_THAT(error_of([&] { linspace(0, 1, 8, mesh({4}), Placements{runs}); }),
                ::testing::HasSubstr(runs.str() + ": strided and head-tail placements are not supported"));
}

TEST_F(FactoryRandomTest, FactoriesDefaultToReplicateAndMakeLeaves) {
  auto m = mesh({2, 2});
  at::Tensor t = ones({7}, m, std::nullopt, at::TensorOptions().requires_grad(true));
  EXPECT_EQ(placements_of(t), (Placements{Replicate(), Replicate()}));
  EXPECT_EQ(t.scalar_type(), at::get_default_dtype_as_scalartype());
  EXPECT_TRUE(t.requires_grad());
  EXPECT_TRUE(t.is_leaf());
  (t * 3).sum().backward();
  EXPECT_TRUE(tensors_equal(full_tensor(t.grad()), at::full({7}, 3.0)));
  at::Tensor r = randn({7}, m, Placements{Shard(0), Replicate()}, at::TensorOptions().requires_grad(true));
  EXPECT_TRUE(r.requires_grad());
  EXPECT_TRUE(r.is_leaf());
}

TEST_F(FactoryRandomTest, FactoriesRejectBadArguments) {
  EXPECT_THROW(zeros({5, 3}, nullptr), DTensorError);
  EXPECT_THROW(zeros({5, -1}, mesh({4})), DTensorError);
  EXPECT_THROW(zeros({5, 3}, mesh({4}), Placements{Shard(2)}), DTensorError);
  EXPECT_THROW(ones({5}, mesh({2, 2}), Placements{Shard(0)}), DTensorError);
}

TEST_F(FactoryRandomTest, RandAndRandnDrawWhatOneDeviceDraws) {
  for (const Shape& shape : {Shape{5, 3}, Shape{7, 4}}) {
    for (const auto& [m, p] : layouts_2d()) {
      SCOPED_TRACE(shape_str(shape) + " " + describe(m, p));
      at::manual_seed(42);
      const at::Tensor u = at::rand(shape), n = at::randn(shape), after = at::rand({3});
      at::manual_seed(42);
      at::Tensor du = rand(shape, m, p), dn = randn(shape, m, p);
      // The generator advanced exactly as on one device.
      const at::Tensor after_dist = at::rand({3});
      EXPECT_TRUE(tensors_equal(full_tensor(du), u));
      EXPECT_TRUE(tensors_equal(full_tensor(dn), n));
      EXPECT_TRUE(tensors_equal(after_dist, after));
    }
  }
}

TEST_F(FactoryRandomTest, RandWithAGeneratorAndADtype) {
  auto m = mesh({4});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor expected = at::randn({9, 2}, gen, at::kDouble);
  gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor dt = randn({9, 2}, m, Placements{Shard(0)}, at::TensorOptions().dtype(at::kDouble), gen);
  EXPECT_TRUE(tensors_equal(full_tensor(dt), expected));
}

// A random op applied to a DTensor of each layout, and to the whole tensor after the same seed.
void expect_same_draws(const std::string& what, const std::function<at::Tensor(const at::Tensor&)>& op,
                       const at::Tensor& input) {
  for (const auto& [m, p] : layouts_2d()) {
    SCOPED_TRACE(what + " " + describe(m, p));
    at::manual_seed(3);
    const at::Tensor expected = op(input.clone());
    at::manual_seed(3);
    at::Tensor actual = op(make_dtensor_holding(input.clone(), m, p));  // in-place ops must not change `input`
    EXPECT_TRUE(is_dtensor(actual));
    // Exact, but summing a Partial result's contributions may round differently.
    if (has_partial(p)) EXPECT_TRUE(tensors_close(full_tensor(actual), expected));
    else EXPECT_TRUE(tensors_equal(full_tensor(actual), expected));
  }
}

TEST_F(FactoryRandomTest, RandomOpsOnShardedDTensorsDrawWhatOneDeviceDraws) {
  const at::Tensor x = test_tensor({7, 5}, at::kFloat, 5);  // 7 rows over 4 ranks: 2,2,2,1
  const at::Tensor probs = at::linspace(0.05, 0.95, 35).reshape({7, 5});
  expect_same_draws("uniform_", [](const at::Tensor& t) { return t.uniform_(-2, 2); }, x);
  expect_same_draws("normal_", [](const at::Tensor& t) { return t.normal_(0, 3); }, x);  // >= 16: vectorised fill
  expect_same_draws("bernoulli_", [](const at::Tensor& t) { return t.bernoulli_(0.3); }, x);
  expect_same_draws("bernoulli", [](const at::Tensor& t) { return at::bernoulli(t); }, probs);
  expect_same_draws("rand_like", [](const at::Tensor& t) { return at::rand_like(t); }, x);
  expect_same_draws("randn_like", [](const at::Tensor& t) { return at::randn_like(t); }, x);
  expect_same_draws("randint_like", [](const at::Tensor& t) { return at::randint_like(t, 100); }, x);
  expect_same_draws("dropout", [](const at::Tensor& t) { return at::dropout(t, 0.4, true); }, x);
  expect_same_draws("native_dropout", [](const at::Tensor& t) { return std::get<0>(at::native_dropout(t, 0.4, true)); }, x);
  expect_same_draws("native_dropout mask", [](const at::Tensor& t) { return std::get<1>(at::native_dropout(t, 0.4, true)); }, x);
}

TEST_F(FactoryRandomTest, DropoutGradientsMatchOneDevice) {
  const at::Tensor x = test_tensor({5, 3}, at::kDouble, 9);
  for (const auto& [m, p] : layouts_2d()) {
    if (has_partial(p)) continue;  // Shard and Replicate leaves
    SCOPED_TRACE(describe(m, p));
    at::Tensor full_x = x.clone().requires_grad_(), dist_x = distribute_tensor(x.clone().requires_grad_(), m, p);
    at::manual_seed(11);
    (at::dropout(full_x, 0.5, true) * full_x).sum().backward();
    at::manual_seed(11);
    (std::get<0>(at::native_dropout(full_x, 0.5, true)) * 2).sum().backward();
    at::manual_seed(11);
    (at::dropout(dist_x, 0.5, true) * dist_x).sum().backward();
    at::manual_seed(11);
    (std::get<0>(at::native_dropout(dist_x, 0.5, true)) * 2).sum().backward();
    EXPECT_TRUE(tensors_equal(full_tensor(dist_x.grad()), full_x.grad()));
  }
}

TEST_F(FactoryRandomTest, RandomFillOfAPartialTensorHoldsTheDrawnValue) {
  // The filled tensor keeps Partial: contributions that reduce to the drawn values.
  const at::Tensor x = test_tensor({5, 3}, at::kDouble, 2);
  for (const auto& [m, p] : layouts_2d()) {
    if (!has_partial(p)) continue;
    at::Tensor dt = make_dtensor_holding(x.clone(), m, p);
    SCOPED_TRACE(describe(m, p));
    at::manual_seed(5);
    const at::Tensor expected = x.clone().uniform_();
    at::manual_seed(5);
    dt.uniform_();
    EXPECT_EQ(placements_of(dt), p);
    EXPECT_TRUE(tensors_equal(full_tensor(dt), expected));
  }
}

TEST_F(FactoryRandomTest, RandomFillFollowsTheGlobalMemoryOrder) {
  // Filling a transposed view visits the elements in memory order, on one device and on DTensors.
  auto m = mesh({4});
  at::manual_seed(8);
  at::Tensor expected = at::empty({5, 6});
  expected.t().uniform_();
  at::manual_seed(8);
  at::Tensor dt = empty({5, 6}, m, Placements{Shard(0)});
  dt.t().uniform_();
  EXPECT_TRUE(tensors_equal(full_tensor(dt), expected));
}

TEST_F(FactoryRandomTest, RandomOpsNeedNoCommunicationForShardedInputs) {
  auto m = mesh({4});
  at::Tensor x = distribute_tensor(test_tensor({7, 5}, at::kFloat, 1), m, Placements{Shard(0)});
  CommDebugMode debug;
  at::Tensor y = at::dropout(x, 0.3, true);
  at::Tensor z = at::rand_like(x).bernoulli_(0.5);
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  EXPECT_EQ(placements_of(y), Placements{Shard(0)});
  EXPECT_EQ(placements_of(z), Placements{Shard(0)});
}

TEST_F(FactoryRandomTest, RanksOutsideTheMeshDrawWhatTheMeshDraws) {
  // Calls on a sub-mesh advance every rank's generator alike, so a later call on the whole world draws
  // the same values on every rank: those of one device making all the calls.
  auto sub = mesh({2}, {0, 1}), all = mesh({4});
  const at::Tensor x = test_tensor({6, 3}, at::kFloat, 4);
  at::manual_seed(6);
  const at::Tensor first = at::randn({5, 3}), dropped = std::get<0>(at::native_dropout(x, 0.5, true)), last = at::rand({6});
  at::manual_seed(6);
  const at::Tensor dist_first = randn({5, 3}, sub, Placements{Shard(0)});
  const at::Tensor dist_dropped = std::get<0>(at::native_dropout(distribute_tensor(x, sub, Placements{Shard(1)}), 0.5, true));
  const at::Tensor dist_last = rand({6}, all, Placements{Shard(0)});
  EXPECT_TRUE(tensors_equal(full_tensor(dist_last), last));
  if (sub->contains_this_rank()) {
    EXPECT_TRUE(tensors_equal(full_tensor(dist_first), first));
    EXPECT_TRUE(tensors_equal(full_tensor(dist_dropped), dropped));
  }
}

TEST_F(FactoryRandomTest, LearningDropoutOutputsLeavesTheGeneratorToOtherThreads) {
  // native_dropout has no Meta kernel, so each propagation-cache miss works its outputs out another way;
  // that must never touch the shared generator. One thread misses the cache again and again on eval
  // dropout (which itself draws nothing) while this one draws: this thread's values must be the ones it
  // draws alone.
  const at::Tensor x = zeros({2048, 1024}, mesh({4}), Placements{Shard(0)});
  at::manual_seed(21);
  std::atomic<bool> done{false};
  std::thread misses([&] {
    for (int i = 0; i < 20; ++i) {
      clear_propagation_cache();
      (void)at::native_dropout(x, 0.5, false);
    }
    done = true;
  });
  std::vector<at::Tensor> drawn;
  while (!done) drawn.push_back(at::rand({4}));
  misses.join();
  at::manual_seed(21);
  std::vector<at::Tensor> alone;
  while (alone.size() < drawn.size()) alone.push_back(at::rand({4}));
  const at::Tensor together = at::stack(drawn), apart = at::stack(alone);
  if (!at::equal(together, apart))
    ADD_FAILURE() << "draw " << together.ne(apart).any(1).nonzero()[0].item<int64_t>() << " of " << drawn.size()
                  << " differs from the one drawn alone";
}

}  // namespace
}  // namespace dtensor::testing
