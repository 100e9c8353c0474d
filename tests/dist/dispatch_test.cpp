// Op dispatch on DTensors: strategy choice and its communication, mixing with plain tensors, in-place
// and out= ops, views, the propagation cache and errors — against single-device LibTorch.

#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include "dtensor/comm_debug.h"
#include "dtensor/sharding.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;


const at::Tensor& x65() {
  static const at::Tensor t = test_tensor({6, 5}, at::kDouble, 1);
  return t;
}
const at::Tensor& w57() {
  static const at::Tensor t = test_tensor({5, 7}, at::kDouble, 2);
  return t;
}

class DispatchTest : public DistTest {};

TEST_F(DispatchTest, MatmulAndPointwiseOnDTensors) {
  auto m = mesh({4});
  at::Tensor y = at::mm(distribute_tensor(x65(), m, Placements{Shard(0)}), distribute_tensor(w57(), m, Placements{Replicate()}));
  EXPECT_EQ(placements_of(y), (Placements{Shard(0)}));
  EXPECT_TRUE(tensors_equal(full_tensor(y), at::mm(x65(), w57())));
  at::Tensor z = at::relu(y + 1) * 2;
  EXPECT_TRUE(tensors_equal(full_tensor(z), at::relu(at::mm(x65(), w57()) + 1) * 2));
}

TEST_F(DispatchTest, ColumnShardedWeightMatmulNeedsNoCollective) {
  auto m = mesh({4});
  at::Tensor x = distribute_tensor(x65(), m), w = distribute_tensor(w57(), m, Placements{Shard(1)});
  CommDebugMode debug;
  at::Tensor y = at::mm(x, w);
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  EXPECT_EQ(placements_of(y), (Placements{Shard(1)}));
}

TEST_F(DispatchTest, RowShardedMatmulThenReplicateIsOneAllReduce) {
  auto m = mesh({4});
  at::Tensor x = distribute_tensor(x65(), m, Placements{Shard(1)}), w = distribute_tensor(w57(), m, Placements{Shard(0)});
  CommDebugMode debug;
  at::Tensor y = at::mm(x, w);
  EXPECT_EQ(placements_of(y), (Placements{Partial()}));
  EXPECT_EQ(debug.total_count(), 0);
  at::Tensor whole = redistribute(y, {Replicate()});
  EXPECT_EQ(debug.total_count(), 1) << debug.summary();
  EXPECT_EQ(debug.count("all-reduce"), 1);
  EXPECT_TRUE(tensors_close(to_local(whole), at::mm(x65(), w57())));
}

TEST_F(DispatchTest, StrategyNeedingNoRedistributionWins) {
  // x S(0) @ w S(0): keeping x and gathering w (35 doubles) beats gathering x (30 doubles) only when
  // it moves fewer bytes; either way the choice is the cheapest and the result is right.
  auto m = mesh({4});
  at::Tensor x = distribute_tensor(x65(), m, Placements{Shard(0)}), w = distribute_tensor(w57(), m, Placements{Shard(0)});
  CommDebugMode debug;
  at::Tensor y = at::mm(x, w);
  EXPECT_EQ(debug.total_count(), 1) << debug.summary();
  EXPECT_TRUE(tensors_close(full_tensor(y), at::mm(x65(), w57())));
}

TEST_F(DispatchTest, ZeroDimPlainTensorActsAsReplicate) {
  at::Tensor dt = distribute_tensor(x65(), mesh({4}), Placements{Shard(0)});
  at::Tensor y = dt * at::scalar_tensor(3.0, at::kDouble);
  EXPECT_EQ(placements_of(y), (Placements{Shard(0)}));
  EXPECT_TRUE(tensors_equal(full_tensor(y), x65() * 3));
}

TEST_F(DispatchTest, AddingANumberToAPartialSumStaysPartial) {
  auto m = mesh({4});
  at::Tensor p = make_dtensor_holding(x65(), m, {Partial()});
  CommDebugMode debug;
  at::Tensor y = p + 2;
  y.add_(1.5);
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  EXPECT_EQ(placements_of(y), (Placements{Partial()}));
  EXPECT_TRUE(tensors_equal(full_tensor(y), x65() + 3.5));
}

TEST_F(DispatchTest, AnyOfAPartialMaxIsReducedFirst) {
  // amax over the sharded dim is Partial(max) with contributions 0, -1, -1, -1; any() of it is any(0).
  const at::Tensor x = at::tensor({0.0, -1.0, -1.0, -1.0, -1.0}, at::kDouble);
  at::Tensor dt = distribute_tensor(x, mesh({4}), Placements{Shard(0)});
  EXPECT_TRUE(tensors_equal(full_tensor(dt.amax(0).any()), x.amax(0).any()));
  EXPECT_TRUE(tensors_equal(full_tensor(dt.amin(0).all()), x.amin(0).all()));
}

TEST_F(DispatchTest, NegativeOrderNormWithAnEmptyShard) {
  const at::Tensor x = test_tensor({5}, at::kDouble, 4) + 20;  // 5 over 4 ranks: the last shard is empty
  at::Tensor dt = distribute_tensor(x, mesh({4}), Placements{Shard(0)});
  EXPECT_TRUE(tensors_close(full_tensor(at::linalg_vector_norm(dt, -1)), at::linalg_vector_norm(x, -1)));
}

TEST_F(DispatchTest, RanksOutsideTheMeshReturnEmptyShardsOfEveryOutput) {
  auto m = mesh({2}, {0, 1});
  at::Tensor dt = distribute_tensor(test_tensor({4, 6}, at::kDouble, 5), m, Placements{Shard(0)});
  auto pieces = at::split(dt, 2, 1);
  ASSERT_EQ(pieces.size(), 3u);
  for (const auto& p : pieces) EXPECT_TRUE(is_dtensor(p));
  if (world()->rank() >= 2) EXPECT_EQ(local_tensor_of(pieces[0]).numel(), 0);
}

TEST_F(DispatchTest, ANumberReadOutsideTheMeshIsAnError) {
  auto m = mesh({2}, {0, 1});
  at::Tensor total = distribute_tensor(test_tensor({4, 6}, at::kDouble, 5), m, Placements{Shard(0)}).sum();
  if (world()->rank() < 2)
    EXPECT_DOUBLE_EQ(total.item<double>(), test_tensor({4, 6}, at::kDouble, 5).sum().item<double>());
  else
    EXPECT_THAT(error_of([&] { total.item<double>(); }), HasSubstr("which this rank (" + std::to_string(world()->rank()) + ") is not part of"));
}

TEST_F(DispatchTest, PlainTensorNeedsImplicitReplication) {
  at::Tensor dt = distribute_tensor(x65(), mesh({4}), Placements{Shard(0)});
  const at::Tensor plain = test_tensor({6, 5}, at::kDouble, 9);
  EXPECT_THAT(error_of([&] { (void)(dt + plain); }),
              HasSubstr("op aten::add.Tensor got a plain tensor of shape [6, 5] (argument 'other') mixed with DTensors"));
  ImplicitReplicationGuard replicate_plain_tensors;
  EXPECT_TRUE(tensors_equal(full_tensor(dt + plain), x65() + plain));
}

TEST_F(DispatchTest, DTensorsOnDifferentMeshesAreAnError) {
  at::Tensor a = distribute_tensor(x65(), mesh({4})), b = distribute_tensor(x65(), mesh({2, 2}));
  EXPECT_THAT(error_of([&] { (void)(a + b); }), HasSubstr("got DTensors on different meshes"));
}

TEST_F(DispatchTest, InPlaceOpKeepsPlacementsAndReturnsSelf) {
  at::Tensor dt = distribute_tensor(x65(), mesh({4}), Placements{Shard(0)});
  at::Tensor other = distribute_tensor(test_tensor({6, 5}, at::kDouble, 3), mesh({4}));
  at::Tensor& result = dt.add_(other, 2);
  EXPECT_TRUE(result.is_same(dt));
  EXPECT_EQ(placements_of(dt), (Placements{Shard(0)}));
  EXPECT_TRUE(tensors_equal(full_tensor(dt), x65() + 2 * test_tensor({6, 5}, at::kDouble, 3)));
}

TEST_F(DispatchTest, InPlaceOpThatWouldMoveShardsIsAnError) {
  // A cumulative sum along the sharded dim needs it whole: the written tensor's shards would move.
  at::Tensor dt = distribute_tensor(x65(), mesh({4}), Placements{Shard(0)});
  EXPECT_THAT(error_of([&] { dt.cumsum_(0); }), HasSubstr("that keeps the placements of the tensor it writes to"));
}

TEST_F(DispatchTest, OutVariantWritesIntoTheGivenDTensor) {
  auto m = mesh({4});
  at::Tensor out = distribute_tensor(at::zeros({6, 5}, at::kDouble), m, Placements{Shard(1)});
  at::Tensor a = distribute_tensor(x65(), m, Placements{Shard(0)});
  at::Tensor b = distribute_tensor(x65(), m);
  at::Tensor& result = at::mul_out(out, a, b);
  EXPECT_TRUE(result.is_same(out));
  EXPECT_EQ(placements_of(out), (Placements{Shard(1)}));
  EXPECT_TRUE(tensors_equal(full_tensor(out), x65() * x65()));
}

TEST_F(DispatchTest, ViewsAliasTheirInput) {
  at::Tensor dt = distribute_tensor(x65(), mesh({4}), Placements{Shard(0)});
  at::Tensor t = dt.t();
  EXPECT_EQ(placements_of(t), (Placements{Shard(1)}));
  EXPECT_EQ(local_tensor_of(t).data_ptr(), local_tensor_of(dt).data_ptr());
}

TEST_F(DispatchTest, PropagationIsCachedPerCall) {
  at::Tensor a = distribute_tensor(x65(), mesh({4}), Placements{Shard(0)});
  clear_propagation_cache();
  (void)(a * 2);
  (void)(a * 3);  // numbers enter the cache key by kind, not value
  (void)(a * 4);
  EXPECT_EQ(propagation_cache_stats().misses, 1);
  EXPECT_EQ(propagation_cache_stats().hits, 2);
  (void)(a * 2.5);  // a float scalar can change the result's dtype: another entry
  EXPECT_EQ(propagation_cache_stats().misses, 2);
}

// The cache key holds every part of an input spec: specs that differ in any one of them (a placement's
// kind, shard dim, split factor or reduce op; dtype, shape, strides) are separate entries, and each
// call still equals single-device LibTorch's.
TEST_F(DispatchTest, PropagationCacheKeysEveryPartOfTheSpec) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({8, 8}, at::kDouble, 19);
  const std::vector<at::Tensor> inputs = {
      distribute_tensor(x, m, Placements{Shard(0)}),
      distribute_tensor(x, m, Placements{Shard(1)}),
      distribute_tensor(x, m, Placements{Replicate()}),
      distribute_tensor(x, m, Placements{StridedShard(0, 2)}),
      distribute_tensor(x, m, Placements{StridedShard(0, 4)}),
      make_dtensor_holding(x, m, {Partial()}, 5),
      make_dtensor_holding(x, m, {Partial(ReduceOp::Avg)}, 6),
      make_dtensor_holding(x, m, {Partial(ReduceOp::Max)}, 7),
      distribute_tensor(x.to(at::kFloat), m, Placements{Shard(0)}),
      distribute_tensor(x.narrow(1, 0, 4).contiguous(), m, Placements{Shard(0)}),
      distribute_tensor(x, m, Placements{Shard(1)}).t(),  // S(0) again, with transposed strides
  };
  clear_propagation_cache();
  for (int pass = 0; pass < 2; ++pass)
    for (const at::Tensor& in : inputs) {
      SCOPED_TRACE(to_string(placements_of(in)) + " " + shape_str(in.sizes().vec()));
      EXPECT_TRUE(tensors_close(full_tensor(at::neg(in)), full_tensor(in).neg(), 0, 0));
    }
  // full_tensor runs no aten op on a DTensor, so every lookup is neg's: one miss per spec, then hits.
  EXPECT_EQ(propagation_cache_stats().misses, static_cast<int64_t>(inputs.size()));
  EXPECT_EQ(propagation_cache_stats().hits, static_cast<int64_t>(inputs.size()));
}

// Which optional tensor argument a DTensor fills is part of the key too: clamp with a minimum and clamp
// with a maximum of the same spec are two entries, not one decision reused for the other.
TEST_F(DispatchTest, PropagationCacheKeysWhichOptionalTensorIsGiven) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({8, 6}, at::kDouble, 20), bound = test_tensor({8, 6}, at::kDouble, 21);
  const at::Tensor dx = distribute_tensor(x, m, Placements{Shard(0)}), dbound = distribute_tensor(bound, m, Placements{Shard(0)});
  clear_propagation_cache();
  EXPECT_TRUE(tensors_close(full_tensor(at::clamp(dx, dbound, std::nullopt)), at::clamp(x, bound, std::nullopt), 0, 0));
  EXPECT_TRUE(tensors_close(full_tensor(at::clamp(dx, std::nullopt, dbound)), at::clamp(x, std::nullopt, bound), 0, 0));
  EXPECT_EQ(propagation_cache_stats().misses, 2);
  EXPECT_EQ(propagation_cache_stats().hits, 0);
}

TEST_F(DispatchTest, OpWithoutStrategyNamesOpAndWaysOut) {
  at::Tensor dt = distribute_tensor(x65(), mesh({4}), Placements{Shard(0)});
  const std::string error = error_of([&] { (void)at::as_strided(dt, {2, 2}, {1, 1}); });
  EXPECT_THAT(error, HasSubstr("no sharding strategy for op aten::as_strided"));
  EXPECT_THAT(error, HasSubstr("S(0)"));
  EXPECT_THAT(error, HasSubstr("register"));
}

// A slice of a dim that is not sharded is a view of the shard: writes through it reach the DTensor.
// A slice of a sharded dim gathers first, so it holds a copy: a write through it is refused, not lost.
TEST_F(DispatchTest, WritesThroughViewsReachTheirBaseOrAreRefused) {
  auto m = mesh({4});
  at::Tensor rows = distribute_tensor(at::zeros({5, 3}, at::kDouble), m, Placements{Shard(0)});
  rows.narrow(1, 1, 1).fill_(7);
  rows.select(1, 2).fill_(9);
  at::Tensor expected = at::zeros({5, 3}, at::kDouble);
  expected.narrow(1, 1, 1).fill_(7);
  expected.select(1, 2).fill_(9);
  EXPECT_TRUE(at::equal(full_tensor(rows), expected));

  at::Tensor columns = distribute_tensor(at::zeros({5, 3}, at::kDouble), m, Placements{Shard(1)});
  for (const auto& write : std::vector<std::function<void()>>{[&] { columns.narrow(1, 1, 1).fill_(7); },
                                                              [&] { columns.select(1, 2).copy_(distribute_tensor(at::ones({5}, at::kDouble), m)); }}) {
    const std::string error = error_of(write);
    EXPECT_THAT(error, HasSubstr("is a view of another"));
    EXPECT_THAT(error, HasSubstr("the write would not reach its base"));
  }
  EXPECT_TRUE(at::equal(full_tensor(columns), at::zeros({5, 3}, at::kDouble)));
}

TEST_F(DispatchTest, ReplicateParameterGradientIsPartialAndReducedWhenNeeded) {
  auto m = mesh({4});
  at::Tensor w = distribute_tensor(w57().clone().requires_grad_(), m);
  at::Tensor x = distribute_tensor(x65(), m, Placements{Shard(0)});
  at::mm(x, w).sum().backward();
  ASSERT_TRUE(is_dtensor(w.grad()));
  EXPECT_EQ(placements_of(w.grad()), (Placements{Partial()}));
  const at::Tensor expected_grad = at::mm(x65().t(), at::ones({6, 7}, at::kDouble));
  at::NoGradGuard no_grad;
  EXPECT_TRUE(tensors_close(full_tensor(w.grad()), expected_grad));
  // An SGD step on the Replicate parameter reduces the Partial gradient (one all-reduce).
  CommDebugMode debug;
  w.sub_(w.grad(), 0.5);
  EXPECT_EQ(debug.count("all-reduce"), 1) << debug.summary();
  EXPECT_EQ(placements_of(w), (Placements{Replicate()}));
  EXPECT_TRUE(tensors_close(to_local(w), w57() - 0.5 * expected_grad));
}

TEST_F(DispatchTest, LinearForwardOnTwoByTwoMesh) {
  auto m = mesh({2, 2});
  const at::Tensor x = test_tensor({8, 6}, at::kDouble, 3), w = test_tensor({5, 6}, at::kDouble, 4),
                   b = test_tensor({5}, at::kDouble, 5);
  at::Tensor out = at::linear(distribute_tensor(x, m, Placements{Shard(0), Replicate()}),
                              distribute_tensor(w, m, Placements{Replicate(), Shard(0)}),
                              distribute_tensor(b, m, Placements{Replicate(), Shard(0)}));
  EXPECT_EQ(placements_of(out), (Placements{Shard(0), Shard(1)}));
  EXPECT_TRUE(tensors_close(full_tensor(out), at::linear(x, w, b)));
}

// A custom op (not aten) that dtensor learns to shard through the public registration API.
TORCH_LIBRARY(dtensor_test, m) {
  m.def("double_it(Tensor x) -> Tensor");
  m.def("triple_it(Tensor x) -> Tensor");
  m.def("softmax_along(Tensor x, int dim) -> Tensor");
  m.def("scale_by(Tensor x, int k) -> Tensor");
}
TORCH_LIBRARY_IMPL(dtensor_test, CPU, m) {
  m.impl("double_it", [](const at::Tensor& x) { return x * 2; });
  m.impl("triple_it", [](const at::Tensor& x) { return x * 3; });
  m.impl("softmax_along", [](const at::Tensor& x, int64_t dim) { return at::softmax(x, dim); });
  m.impl("scale_by", [](const at::Tensor& x, int64_t k) { return x * k; });
}

TEST_F(DispatchTest, RegisteringAStrategyForACustomOp) {
  auto double_it = c10::Dispatcher::singleton().findSchemaOrThrow("dtensor_test::double_it", "").typed<at::Tensor(const at::Tensor&)>();
  at::Tensor dt = distribute_tensor(x65(), mesh({4}), Placements{Shard(1)});
  EXPECT_THAT(error_of([&] { double_it.call(dt); }), HasSubstr("no sharding strategy for op dtensor_test::double_it"));
  // Elementwise: any shard stays where it is.
  register_dim_rule("dtensor_test::double_it", [](const OpSchema& s) {
    std::vector<DimStrategy> out = {{{Replicate()}, {Replicate()}}};
    for (int64_t d = 0; d < s.input_ndim(0); ++d) out.push_back({{Shard(d)}, {Shard(d)}});
    return out;
  });
  EXPECT_TRUE(has_sharding_rule("dtensor_test::double_it"));
  CommDebugMode debug;
  at::Tensor y = double_it.call(dt);
  EXPECT_EQ(debug.total_count(), 0);
  EXPECT_EQ(placements_of(y), (Placements{Shard(1)}));
  EXPECT_TRUE(tensors_equal(full_tensor(y), x65() * 2));
}

// A mesh rule states whole-mesh strategies itself: this one offers a single layout, (S(1),S(0)), so a
// 2x2 input placed (S(0),S(1)) is moved to it (no dim rule can pair the mesh dims this way alone).
TEST_F(DispatchTest, RegisteringAMeshRuleForACustomOp) {
  auto triple_it = c10::Dispatcher::singleton().findSchemaOrThrow("dtensor_test::triple_it", "").typed<at::Tensor(const at::Tensor&)>();
  const Placements only{Shard(1), Shard(0)};
  register_mesh_rule("dtensor_test::triple_it", [&](const OpSchema&) { return OpStrategy{PlacementStrategy{{only}, {only}, {}}}; });
  EXPECT_EQ(sharding_rule_family("dtensor_test::triple_it"), "custom");
  auto m = mesh({2, 2});
  CommDebugMode debug;
  at::Tensor y = triple_it.call(distribute_tensor(x65(), m, Placements{Shard(0), Shard(1)}));
  EXPECT_GT(debug.total_count(), 0);
  EXPECT_EQ(placements_of(y), only);
  EXPECT_TRUE(tensors_equal(full_tensor(y), x65() * 3));
}

// register_sharding as PyTorch's docs write it for softmax: Replicate, or Shard on any dim but the
// softmax dim, with None (nullopt) for the int argument; expanded over a 2x2 mesh.
TEST_F(DispatchTest, RegisterShardingTakesPlacementsPerArgumentAsPyTorchDoes) {
  using Softmax = at::Tensor(const at::Tensor&, int64_t);
  auto softmax_along = c10::Dispatcher::singleton().findSchemaOrThrow("dtensor_test::softmax_along", "").typed<Softmax>();
  register_sharding({"dtensor_test::softmax_along"}, [](const OpSchema& s) {
    const int64_t ndim = s.input_ndim(0);
    const int64_t dim = s.args[1].toInt() < 0 ? s.args[1].toInt() + ndim : s.args[1].toInt();
    std::vector<AcceptableSharding> acceptable = {{{Replicate()}, {Replicate(), std::nullopt}}};
    for (int64_t d = 0; d < ndim; ++d)
      if (d != dim) acceptable.push_back({{Shard(d)}, {Shard(d), std::nullopt}});
    return acceptable;
  });
  auto m = mesh({2, 2});
  const at::Tensor full = test_tensor({7, 5}, at::kDouble, 21) / 8;  // 7 rows: uneven over either mesh dim
  const at::Tensor row_shards = distribute_tensor(full, m, Placements{Shard(0), Replicate()});
  CommDebugMode debug;
  const at::Tensor rows = softmax_along.call(row_shards, 1);
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();  // a row shard is a valid softmax input along dim 1
  EXPECT_EQ(placements_of(rows), (Placements{Shard(0), Replicate()}));
  EXPECT_TRUE(tensors_close(full_tensor(rows), at::softmax(full, 1), 1e-12, 1e-14));
  const at::Tensor columns = softmax_along.call(distribute_tensor(full, m, Placements{Shard(1), Shard(0)}), -1);
  EXPECT_NE(placements_of(columns)[0], Shard(1));  // not a valid input sharding: moved first
  EXPECT_TRUE(tensors_close(full_tensor(columns), at::softmax(full, 1), 1e-12, 1e-14));
}

TEST_F(DispatchTest, RegisterShardingRefusesPlacementsThatDoNotMatchTheCall) {
  auto scale_by = c10::Dispatcher::singleton().findSchemaOrThrow("dtensor_test::scale_by", "").typed<at::Tensor(const at::Tensor&, int64_t)>();
  const at::Tensor x = distribute_tensor(x65(), mesh({4}), Placements{Shard(0)});
  register_sharding({"dtensor_test::scale_by"}, [](const OpSchema&) {
    return std::vector<AcceptableSharding>{{{Shard(0)}, {Shard(0), Replicate()}}};
  });
  EXPECT_THAT(error_of([&] { scale_by.call(x, 2); }), HasSubstr("gives R for argument 1 ('k'), which holds no tensor"));
  register_sharding({"dtensor_test::scale_by"}, [](const OpSchema&) {
    return std::vector<AcceptableSharding>{{{Shard(0)}, {std::nullopt, std::nullopt}}};
  });
  EXPECT_THAT(error_of([&] { scale_by.call(x, 2); }), HasSubstr("gives no placement for the tensor argument 'x'"));
  EXPECT_THAT(error_of([&] { register_sharding({}, [](const OpSchema&) { return std::vector<AcceptableSharding>{}; }); }),
              HasSubstr("name at least one op"));
}

}  // namespace
}  // namespace dtensor::testing
