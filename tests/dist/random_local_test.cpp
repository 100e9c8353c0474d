// RandomMode::LocalShards: each rank draws only its shard. The global tensor must not depend on the
// mesh, the world size or the layout; the values must follow their distributions, re-seeding must
// reproduce them, and no rank may allocate the whole tensor.

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "random_layouts.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;

// The layouts of the world's 4 ranks, and sub-meshes of 1 and 2 ranks (the other ranks are outside).
std::vector<std::pair<MeshPtr, Placements>> layouts_and_sub_meshes() {
  auto out = layouts_2d();
  out.push_back({mesh({1}, {0}), {Replicate()}});
  out.push_back({mesh({2}, {0, 1}), {Shard(0)}});
  out.push_back({mesh({2}, {2, 3}), {Shard(1)}});
  return out;
}

// `op` on a DTensor holding `input` in each layout, after the same seed, gives one global tensor: the
// one the call gives on a replicated DTensor of the world, where every rank computes every element.
// The call after it (a rand on the world) is the same everywhere too: ranks outside a sub-mesh keep
// their generators in step with the ranks on it.
void expect_one_global_tensor(const std::string& what, const std::function<at::Tensor(const at::Tensor&)>& op,
                              const at::Tensor& input) {
  RandomModeGuard local(RandomMode::LocalShards);
  const auto world_mesh = mesh({4});
  at::manual_seed(3);
  const at::Tensor expected = full_tensor(op(make_dtensor_holding(input, world_mesh, {Replicate()})));
  const at::Tensor next = full_tensor(rand({8}, world_mesh));
  for (const auto& [m, p] : layouts_and_sub_meshes()) {
    SCOPED_TRACE(what + " " + describe(m, p));
    at::manual_seed(3);
    const at::Tensor actual = op(make_dtensor_holding(input, m, p));
    EXPECT_TRUE(tensors_equal(full_tensor(rand({8}, world_mesh)), next));
    if (!m->contains_this_rank()) continue;
    // Summing a Partial result's contributions may round differently.
    if (has_partial(p)) EXPECT_TRUE(tensors_close(full_tensor(actual), expected));
    else EXPECT_TRUE(tensors_equal(full_tensor(actual), expected));
  }
}

// `whole`, replicated on `like`'s mesh: a broadcast parameter.
at::Tensor replicated_like(const at::Tensor& whole, const at::Tensor& like) {
  return make_dtensor_holding(whole, mesh_of(like), Placements(mesh_of(like)->ndim(), Replicate()));
}

class RandomLocalTest : public DistTest {};

TEST_F(RandomLocalTest, LocalShardsMakeOneGlobalTensorWhateverTheMeshAndLayout) {
  const at::Tensor x = test_tensor({7, 5}, at::kFloat, 5);  // 7 rows over 4 ranks: 2,2,2,1
  const at::Tensor probs = at::linspace(0.05, 0.95, 35).reshape({7, 5});
  const at::Tensor row = at::linspace(0.1, 0.9, 5);
  expect_one_global_tensor("uniform_", [](const at::Tensor& t) { return t.uniform_(-2, 2); }, x);
  expect_one_global_tensor("uniform_ double", [](const at::Tensor& t) { return t.uniform_(); }, x.to(at::kDouble));
  expect_one_global_tensor("normal_", [](const at::Tensor& t) { return t.normal_(1, 3); }, x);
  expect_one_global_tensor("bernoulli_", [](const at::Tensor& t) { return t.bernoulli_(0.3); }, x);
  expect_one_global_tensor("bernoulli_ broadcast p", [&](const at::Tensor& t) { return t.bernoulli_(replicated_like(row, t)); }, x);
  expect_one_global_tensor("bernoulli", [](const at::Tensor& t) { return at::bernoulli(t); }, probs);
  expect_one_global_tensor("bernoulli p", [](const at::Tensor& t) { return at::bernoulli(t, 0.6); }, x);
  expect_one_global_tensor("exponential_", [](const at::Tensor& t) { return t.exponential_(2); }, x);
  expect_one_global_tensor("cauchy_", [](const at::Tensor& t) { return t.cauchy_(1, 2); }, x);
  expect_one_global_tensor("log_normal_", [](const at::Tensor& t) { return t.log_normal_(0, 0.5); }, x);
  expect_one_global_tensor("geometric_", [](const at::Tensor& t) { return t.geometric_(0.4); }, x);
  expect_one_global_tensor("normal tensor tensor", [](const at::Tensor& t) { return at::normal(t, t); }, probs);
  expect_one_global_tensor("normal broadcast std", [&](const at::Tensor& t) { return at::normal(t, replicated_like(row, t)); }, probs);
  expect_one_global_tensor("normal tensor float", [](const at::Tensor& t) { return at::normal(t, 0.5); }, x);
  expect_one_global_tensor("normal float tensor", [](const at::Tensor& t) { return at::normal(2.0, t); }, probs);
  expect_one_global_tensor("rand_like", [](const at::Tensor& t) { return at::rand_like(t); }, x);
  expect_one_global_tensor("rand_like half", [](const at::Tensor& t) { return at::rand_like(t, at::kHalf).to(at::kFloat); }, x);
  expect_one_global_tensor("rand_like generator", [](const at::Tensor& t) { return at::rand_like(t, at::detail::createCPUGenerator(3)); },
                           x);
  expect_one_global_tensor("uniform", [](const at::Tensor& t) { return at::uniform(t, -2, 2); }, x);
  expect_one_global_tensor("exponential", [](const at::Tensor& t) { return at::exponential(t, 2); }, x);
  expect_one_global_tensor("geometric", [](const at::Tensor& t) { return at::geometric(t, 0.4); }, x);
  expect_one_global_tensor("bernoulli tensor p", [&](const at::Tensor& t) { return at::bernoulli(t, replicated_like(probs, t)); }, x);
  expect_one_global_tensor("randn_like", [](const at::Tensor& t) { return at::randn_like(t); }, x.t());
  expect_one_global_tensor("dropout", [](const at::Tensor& t) { return at::dropout(t, 0.4, true); }, x);
  expect_one_global_tensor("native_dropout", [](const at::Tensor& t) { return std::get<0>(at::native_dropout(t, 0.4, true)); }, x);
  expect_one_global_tensor("native_dropout mask", [](const at::Tensor& t) { return std::get<1>(at::native_dropout(t, 0.4, true)); }, x);
  // 3 columns over 4 ranks (1,1,1,0), and no elements at all.
  expect_one_global_tensor("uniform_ narrow", [](const at::Tensor& t) { return t.uniform_(); }, x.narrow(1, 0, 3).contiguous());
  expect_one_global_tensor("native_dropout empty", [](const at::Tensor& t) { return std::get<1>(at::native_dropout(t, 0.4, true)); },
                           at::empty({0, 5}));
}

TEST_F(RandomLocalTest, LocalShardsFollowTheirDistributions) {
  RandomModeGuard local(RandomMode::LocalShards);
  const auto m = mesh({2, 2});
  const Shape shape = {1000, 1001};  // uneven over both mesh dims
  const double n = static_cast<double>(numel(shape));
  auto draw = [&](const std::function<void(at::Tensor&)>& fill) {
    at::Tensor t = empty(shape, m, Placements{Shard(0), Shard(1)}, at::TensorOptions().dtype(at::kDouble));
    fill(t);
    return full_tensor(t).flatten();
  };
  // The sample mean of f(value) is within 5 standard errors of its expectation.
  auto expect_mean = [&](const std::string& what, const at::Tensor& f, double mean, double sd) {
    EXPECT_NEAR(f.mean().item<double>(), mean, 5 * sd / std::sqrt(n)) << what;
  };
  at::manual_seed(17);

  const at::Tensor u = (draw([](at::Tensor& t) { t.uniform_(-1, 3); }) + 1) / 4;  // back to [0, 1)
  EXPECT_GE(u.min().item<double>(), 0);
  EXPECT_LT(u.max().item<double>(), 1);
  expect_mean("uniform", u, 0.5, std::sqrt(1.0 / 12));
  expect_mean("uniform squared", u * u, 1.0 / 3, std::sqrt(1.0 / 5 - 1.0 / 9));
  for (int bin = 0; bin < 16; ++bin) {  // equal counts in 16 bins
    const at::Tensor in = (u >= bin / 16.0).logical_and(u < (bin + 1) / 16.0).to(at::kDouble);
    expect_mean("uniform bin " + std::to_string(bin), in, 1.0 / 16, std::sqrt(15.0 / 256));
  }
  // Neighbouring elements, and the same element in two calls, are uncorrelated.
  const at::Tensor centred = u - 0.5, again = draw([](at::Tensor& t) { t.uniform_(); }) - 0.5;
  expect_mean("neighbours", centred.slice(0, 1) * centred.slice(0, 0, -1), 0, 1.0 / 12);
  expect_mean("two calls", centred * again, 0, 1.0 / 12);

  const at::Tensor z = (draw([](at::Tensor& t) { t.normal_(2, 3); }) - 2) / 3;
  expect_mean("normal", z, 0, 1);
  expect_mean("normal squared", z * z, 1, std::sqrt(2.0));
  expect_mean("normal within 1 sd", z.abs().lt(1).to(at::kDouble), 0.682689, std::sqrt(0.682689 * 0.317311));

  const at::Tensor e = draw([](at::Tensor& t) { t.exponential_(2); });
  EXPECT_GT(e.min().item<double>(), 0);
  expect_mean("exponential", e, 0.5, 0.5);

  expect_mean("bernoulli", draw([](at::Tensor& t) { t.bernoulli_(0.3); }), 0.3, std::sqrt(0.21));

  const at::Tensor g = draw([](at::Tensor& t) { t.geometric_(0.4); });
  EXPECT_GE(g.min().item<double>(), 1);
  EXPECT_TRUE(at::equal(g, g.round()));
  expect_mean("geometric", g, 2.5, std::sqrt(0.6) / 0.4);

  expect_mean("log_normal", draw([](at::Tensor& t) { t.log_normal_(1, 0.5); }).log(), 1, 0.5);

  const at::Tensor c = draw([](at::Tensor& t) { t.cauchy_(1, 2); });
  expect_mean("cauchy below its median", c.lt(1).to(at::kDouble), 0.5, 0.5);
  expect_mean("cauchy within one scale", (c - 1).abs().lt(2).to(at::kDouble), 0.5, 0.5);
}

TEST_F(RandomLocalTest, LocalShardsAreReproducibleAndDifferPerCall) {
  RandomModeGuard local(RandomMode::LocalShards);
  const auto m = mesh({4});
  const Shape shape = {9, 4};
  at::manual_seed(5);
  const at::Tensor a = full_tensor(rand(shape, m, Placements{Shard(0)}));
  const at::Tensor b = full_tensor(rand(shape, m, Placements{Shard(0)}));
  EXPECT_EQ(a.ne(b).sum().item<int64_t>(), a.numel());  // every element of the next call differs
  at::manual_seed(5);
  EXPECT_TRUE(tensors_equal(full_tensor(rand(shape, m, Placements{Shard(1)})), a));
  at::manual_seed(6);
  EXPECT_EQ(full_tensor(rand(shape, m, Placements{Shard(0)})).ne(a).sum().item<int64_t>(), a.numel());

  // An explicit generator gives the key, and the default one is left alone.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  at::manual_seed(5);
  const at::Tensor with_generator = full_tensor(randn(shape, m, Placements{Shard(0)}, {}, generator));
  const at::Tensor default_next = at::rand({3});
  at::manual_seed(5);
  EXPECT_TRUE(tensors_equal(at::rand({3}), default_next));
  generator = at::make_generator<at::CPUGeneratorImpl>(7);
  EXPECT_TRUE(tensors_equal(full_tensor(randn(shape, m, Placements{Shard(1)}, {}, generator)), with_generator));
}

// Records the largest CPU allocation any thread makes while alive.
class LargestAllocation final : public c10::Allocator {
 public:
  LargestAllocation() : inner_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(this); }
  ~LargestAllocation() override { c10::SetCPUAllocator(inner_); }
  size_t bytes() const { return largest_; }

  c10::DataPtr allocate(size_t n) override {
    size_t seen = largest_;
    while (n > seen && !largest_.compare_exchange_weak(seen, n)) {
    }
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { inner_->copy_data(dest, src, count); }

 private:
  c10::Allocator* inner_;
  std::atomic<size_t> largest_{0};
};

TEST_F(RandomLocalTest, LocalShardsNeverAllocateTheWholeTensor) {
  // 64 MiB of floats over 4 ranks: a shard is 16 MiB (its variates, doubles, 32 MiB).
  const Shape shape = {1 << 12, 1 << 12};
  const size_t whole = static_cast<size_t>(numel(shape)) * sizeof(float);
  const auto m = mesh({4});
  const Placements rows{Shard(0)};
  const at::Tensor x = ones(shape, m, rows);
  size_t local_mode = 0, exact_mode = 0;
  {
    RandomModeGuard local(RandomMode::LocalShards);
    LargestAllocation largest;
    ASSERT_EQ(c10::GetCPUAllocator(), &largest);
    (void)rand(shape, m, rows);
    (void)randn(shape, m, rows);
    (void)at::bernoulli(x, 0.5);
    (void)at::native_dropout(x, 0.5, true);
    (void)at::dropout(x, 0.5, true);
    local_mode = largest.bytes();
  }
  {
    LargestAllocation largest;
    (void)rand(shape, m, rows);
    exact_mode = largest.bytes();
  }
  EXPECT_LT(local_mode, whole);
  EXPECT_GE(exact_mode, whole);  // the exact mode does allocate it, and the recorder sees that
}

TEST_F(RandomLocalTest, LocalShardDropoutGradientsAreTheAppliedMask) {
  RandomModeGuard local(RandomMode::LocalShards);
  const at::Tensor x = test_tensor({7, 5}, at::kDouble, 9).abs() + 1;  // no zeros: a zero output was dropped
  for (const auto& [m, p] : layouts_2d()) {
    if (has_partial(p)) continue;  // Shard and Replicate leaves
    SCOPED_TRACE(describe(m, p));
    at::Tensor dx = distribute_tensor(x.clone().requires_grad_(), m, p);
    auto [out, mask] = at::native_dropout(dx, 0.4, true);
    (out * 3).sum().backward();
    const at::Tensor applied = full_tensor(mask).to(at::kDouble);
    EXPECT_TRUE(applied.any().item<bool>() && !applied.all().item<bool>()) << applied;
    EXPECT_TRUE(tensors_close(full_tensor(out), x * applied / 0.6));
    EXPECT_TRUE(tensors_close(full_tensor(dx.grad()), applied * (3 / 0.6)));
    // dropout is empty_like, bernoulli_, div_ and mul on CPU: its gradient is the mask its output shows.
    at::Tensor dy = distribute_tensor(x.clone().requires_grad_(), m, p);
    const at::Tensor y = at::dropout(dy, 0.4, true);
    y.sum().backward();
    EXPECT_TRUE(tensors_close(full_tensor(dy.grad()), full_tensor(y).ne(0).to(at::kDouble) / 0.6));
  }
}

TEST_F(RandomLocalTest, RandomIntegersDrawInTheExactModeWhateverTheMode) {
  RandomModeGuard local(RandomMode::LocalShards);
  const at::Tensor x = test_tensor({7, 5}, at::kFloat, 5);
  at::manual_seed(4);
  const at::Tensor expected = at::randint_like(x, 100);
  at::manual_seed(4);
  EXPECT_TRUE(tensors_equal(full_tensor(at::randint_like(distribute_tensor(x, mesh({4}), Placements{Shard(0)}), 100)), expected));
}

// The message of the c10::Error (LibTorch's own) `f` throws.
template <typename F>
std::string libtorch_error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what();
  }
  return "no c10::Error";
}

TEST_F(RandomLocalTest, LocalShardsCheckTheirArguments) {
  RandomModeGuard local(RandomMode::LocalShards);
  const auto m = mesh({4});
  at::Tensor t = zeros({8, 2}, m, Placements{Shard(0)});  // every rank holds rows: each checks its own
  // LibTorch's own checks of scalar parameters and dtypes, as on one device.
  EXPECT_THAT(libtorch_error_of([&] { t.uniform_(2, 1); }), HasSubstr("uniform_ expects to return a [from, to) range"));
  EXPECT_THAT(libtorch_error_of([&] { t.normal_(0, -1); }), HasSubstr("normal expects std >= 0.0"));
  EXPECT_THAT(libtorch_error_of([&] { t.geometric_(1.5); }), HasSubstr("geometric_ expects p to be in (0, 1)"));
  EXPECT_THAT(libtorch_error_of([&] { zeros({6}, m, Placements{Shard(0)}, at::TensorOptions().dtype(at::kLong)).uniform_(); }),
              HasSubstr("not implemented for 'Long'"));
  // Tensor parameters and dropout's p, which LibTorch checks as it draws.
  const at::Tensor bad = make_dtensor_holding(at::full({8, 2}, 1.5), m, {Shard(0)});
  EXPECT_THAT(error_of([&] { (void)at::bernoulli(bad); }), HasSubstr("bernoulli expects every element of p in [0, 1]"));
  EXPECT_THAT(error_of([&] { (void)at::normal(t, -bad); }), HasSubstr("normal expects all elements of std >= 0.0"));
  EXPECT_THAT(error_of([&] { (void)at::native_dropout(t, 1.5, true); }), HasSubstr("native_dropout expects p in [0, 1]"));
}

TEST_F(RandomLocalTest, RandomModeGuardsNestAndHoldForTheirThreadOnly) {
  EXPECT_EQ(random_mode(), RandomMode::Exact);  // the default
  {
    RandomModeGuard outer(RandomMode::LocalShards);
    {
      RandomModeGuard inner(RandomMode::Exact);
      EXPECT_EQ(random_mode(), RandomMode::Exact);
    }
    EXPECT_EQ(random_mode(), RandomMode::LocalShards);
    std::thread([] { EXPECT_EQ(random_mode(), RandomMode::Exact); }).join();
  }
  set_random_mode(RandomMode::LocalShards);
  std::thread([] { EXPECT_EQ(random_mode(), RandomMode::LocalShards); }).join();
  {
    RandomModeGuard exact(RandomMode::Exact);
    EXPECT_EQ(random_mode(), RandomMode::Exact);
  }
  set_random_mode(RandomMode::Exact);
  EXPECT_EQ(random_mode(), RandomMode::Exact);
}

}  // namespace
}  // namespace dtensor::testing
