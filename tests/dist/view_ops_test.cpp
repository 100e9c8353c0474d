// Views on DTensors: a reshape that splits or merges a sharded dim runs on the local shard with no
// communication when the shards line up, and its result aliases the input's shard; in-place views
// that would reshape a DTensor are refused.

#include <functional>

#include "dtensor/comm_debug.h"
#include "dtensor/errors.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

class ViewOpsTest : public DistTest {};

// [B, S, H*D] -> [B, S, H, D] with H*D sharded: every chunk of H*D is whole rows of D, so H is
// sharded; nothing is sent and the result is a view of the same local memory. H = 7 heads of D = 2
// over 4 ranks gives uneven shards: H*D = 14 in chunks of 4, 4, 4, 2 = heads 2, 2, 2, 1.
TEST_F(ViewOpsTest, ReshapeSplittingShardedHeadsRunsNoCollectiveAndAliases) {
  auto m = mesh({4});
  for (auto [heads, D] : {std::pair<int64_t, int64_t>{4, 8}, {7, 2}}) {
    const int64_t B = 2, S = 3;
    const at::Tensor x = test_tensor({B, S, heads * D}, at::kDouble, 1);
    const at::Tensor dx = distribute_tensor(x, m, Placements{Shard(2)});
    at::Tensor y, back;
    {
      CommDebugMode debug;
      y = dx.reshape({B, S, heads, D});
      back = y.view({B, S, heads * D});
      EXPECT_EQ(debug.total_count(), 0) << debug.summary();
    }
    EXPECT_EQ(placements_of(y), (Placements{Shard(2)}));
    EXPECT_EQ(placements_of(back), (Placements{Shard(2)}));
    EXPECT_TRUE(to_local(y).is_alias_of(to_local(dx)));
    EXPECT_TRUE(to_local(back).is_alias_of(to_local(dx)));
    EXPECT_TRUE(tensors_equal(full_tensor(y), x.reshape({B, S, heads, D})));
    EXPECT_TRUE(tensors_equal(full_tensor(back), x));
  }
}

// Batch and heads sharded on a 2x2 mesh: both stay sharded, still without communication.
TEST_F(ViewOpsTest, ReshapeKeepsBatchAndHeadShardsOn2dMesh) {
  auto m = mesh({2, 2});
  const at::Tensor x = test_tensor({4, 3, 6 * 2}, at::kDouble, 2);
  const at::Tensor dx = distribute_tensor(x, m, Placements{Shard(0), Shard(2)});
  CommDebugMode debug;
  const at::Tensor y = dx.view({4, 3, 6, 2});
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  EXPECT_EQ(placements_of(y), (Placements{Shard(0), Shard(2)}));
  EXPECT_TRUE(to_local(y).is_alias_of(to_local(dx)));
  EXPECT_TRUE(tensors_equal(full_tensor(y), x.view({4, 3, 6, 2})));
}

// H*D = 10 over 4 ranks is chunked 3, 3, 3, 1: not whole rows of D = 2, so the dim is gathered first.
TEST_F(ViewOpsTest, ReshapeWithMisalignedShardsReplicatesThatDim) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({2, 3, 10}, at::kDouble, 3);
  const at::Tensor dx = distribute_tensor(x, m, Placements{Shard(2)});
  CommDebugMode debug;
  const at::Tensor y = dx.view({2, 3, 5, 2});
  EXPECT_EQ(debug.count("all-gather"), 1) << debug.summary();
  EXPECT_EQ(placements_of(y), (Placements{Replicate()}));
  EXPECT_TRUE(tensors_equal(full_tensor(y), x.view({2, 3, 5, 2})));
}

// Operands of the ops in ShapeOpsKeepPartial: two values, an index and a gather/scatter index.
struct Operands {
  at::Tensor x, y, index, gather_index;
};

// Ops that only move or copy values keep a Partial input Partial (no reduction); adding Partial into
// Partial (scatter_add) too.
TEST_F(ViewOpsTest, ShapeOpsKeepPartial) {
  auto m = mesh({4});
  const Operands full{test_tensor({5, 1, 6}, at::kDouble, 5), test_tensor({5, 1, 6}, at::kDouble, 6),
                      at::tensor({2, 0, 2}, at::kLong), at::zeros({5, 1, 6}, at::kLong)};
  const Operands dist{make_dtensor_holding(full.x, m, {Partial()}), make_dtensor_holding(full.y, m, {Partial()}),
                      distribute_tensor(full.index, m), distribute_tensor(full.gather_index, m)};
  const std::vector<std::pair<std::string, std::function<at::Tensor(const Operands&)>>> ops = {
      {"view", [](const Operands& o) { return o.x.view({5, 3, 2}); }},
      {"transpose", [](const Operands& o) { return o.x.transpose(0, 2); }},
      {"squeeze", [](const Operands& o) { return o.x.squeeze(1); }},
      {"slice", [](const Operands& o) { return o.x.slice(0, 1, 4); }},
      {"select", [](const Operands& o) { return o.x.select(2, 3); }},
      {"split", [](const Operands& o) { return o.x.split(2, 0)[1]; }},
      {"cat", [](const Operands& o) { return at::cat({o.x, o.y}, 2); }},
      {"repeat", [](const Operands& o) { return o.x.repeat({1, 2, 1}); }},
      {"index_select", [](const Operands& o) { return o.x.index_select(2, o.index); }},
      {"gather", [](const Operands& o) { return o.x.gather(0, o.gather_index); }},
      {"scatter_add", [](const Operands& o) { return o.x.scatter_add(0, o.gather_index, o.y); }},
  };
  for (const auto& [name, op] : ops) {
    CommDebugMode debug;
    const at::Tensor out = op(dist);
    EXPECT_EQ(debug.total_count(), 0) << name << "\n" << debug.summary();
    EXPECT_EQ(placements_of(out), (Placements{Partial()})) << name;
    EXPECT_TRUE(tensors_equal(full_tensor(out), op(full))) << name;
  }
}

// conj() and the negative view of complex DTensors: the bit is the shard's, so to_local, full_tensor
// and the ops that read the bit themselves (mm) see conjugated values, and gradients through them
// equal one device's. Before, the bit sat on the DTensor and mm computed with unconjugated shards.
TEST_F(ViewOpsTest, ConjugateViewsConjugateTheShard) {
  const at::Tensor x = at::complex(test_tensor({5, 6}, at::kDouble, 1), test_tensor({5, 6}, at::kDouble, 2));
  const at::Tensor c = at::complex(test_tensor({5, 6}, at::kDouble, 3), test_tensor({5, 6}, at::kDouble, 4));
  for (const auto& m : {mesh({4}), mesh({2, 2})}) {
    for (const Placements& p : {Placements(m->ndim(), Replicate()), Placements(m->ndim(), Shard(0))}) {
      SCOPED_TRACE(m->str() + " " + to_string(p));
      const at::Tensor d = distribute_tensor(x, m, p);
      EXPECT_TRUE(tensors_equal(full_tensor(d.conj()), x.conj().resolve_conj()));
      EXPECT_TRUE(tensors_equal(to_local(d.conj()).resolve_conj(), expected_shard(x.conj().resolve_conj(), m, p)));
      EXPECT_TRUE(tensors_equal(full_tensor(d.conj().conj()), x));
      EXPECT_TRUE(tensors_equal(full_tensor(at::_neg_view(d)), -x));
      const at::Tensor r = redistribute(d, Placements(m->ndim(), Replicate()));
      EXPECT_TRUE(tensors_equal(full_tensor(at::mm(d, r.conj().t())), at::mm(x, x.conj().t())));
      at::Tensor leaf = distribute_tensor(x, m, p).requires_grad_(), one = x.clone().requires_grad_();
      (leaf.conj() * distribute_tensor(c, m, p)).sum().abs().backward();
      (one.conj() * c).sum().abs().backward();
      EXPECT_TRUE(tensors_close(full_tensor(leaf.grad()), one.grad(), 1e-12, 1e-9));
    }
  }
}

// Complex DTensors move and sum through every backend (Gloo has no complex types: they travel as their
// real and imaginary parts), on a 1-d mesh of 4 with uneven shards; max of complex values is refused.
TEST_F(ViewOpsTest, ComplexDTensorsRedistributeOnEveryBackend) {
  auto m = mesh({4});
  const at::Tensor x = at::complex(test_tensor({5, 6}, at::kDouble, 5), test_tensor({5, 6}, at::kDouble, 6));
  const Placements R = {Replicate()}, S0 = {Shard(0)}, S1 = {Shard(1)};
  const at::Tensor rows = distribute_tensor(x, m, S0);  // scatter
  EXPECT_TRUE(tensors_equal(to_local(rows), expected_shard(x, m, S0)));
  EXPECT_TRUE(tensors_equal(full_tensor(rows), x));                                          // all-gather
  EXPECT_TRUE(tensors_equal(to_local(redistribute(rows, S1)), expected_shard(x, m, S1)));   // all-to-all
  EXPECT_TRUE(tensors_equal(full_tensor(distribute_tensor(x, m, R)), x));                   // broadcast
  const at::Tensor mine = m->coordinate()->at(0) == 0 ? x : at::zeros_like(x);              // P: x on rank 0
  const FromLocalOptions whole{.run_check = false, .shape = x.sizes().vec(), .stride = x.strides().vec()};
  EXPECT_TRUE(tensors_equal(to_local(redistribute(from_local(mine, m, {Partial()}, whole), R)), x));   // all-reduce
  EXPECT_TRUE(tensors_equal(to_local(redistribute(from_local(mine, m, {Partial()}, whole), S0)),
                            expected_shard(x, m, S0)));  // reduce-scatter
  const std::string error = error_of([&] { redistribute(from_local(mine, m, {Partial(ReduceOp::Max)}, whole), R); });
  EXPECT_THAT(error, ::testing::HasSubstr("complex numbers are not ordered"));
}

TEST_F(ViewOpsTest, WritesThroughAViewReachTheDTensor) {
  // The shard is laid out transposed against the global (contiguous) strides given to from_local; a view
  // of the DTensor must still alias it, so a write through the view changes the DTensor.
  auto m = mesh({4});
  const at::Tensor full = test_tensor({8, 3}, at::kDouble, 21);
  const at::Tensor shard = full.narrow(0, 2 * world()->rank(), 2).t().contiguous().t();  // strides (1, 2)
  FromLocalOptions options;
  options.run_check = false;
  options.shape = Shape{8, 3};
  options.stride = Shape{3, 1};
  at::Tensor dt = from_local(shard, m, {Shard(0)}, options);
  at::Tensor flat = dt.view({24});
  flat.mul_(0);
  EXPECT_TRUE(tensors_equal(full_tensor(dt), at::zeros({8, 3}, at::kDouble)));
  // A gradient that arrives transposed is laid out like its DTensor, so autograd's views alias it too.
  at::Tensor w = distribute_tensor(full, m, Placements{Shard(0)}).requires_grad_();
  (w.view({24}) * distribute_tensor(at::arange(24, at::kDouble), m)).sum().backward();
  EXPECT_TRUE(tensors_equal(full_tensor(w.grad()), at::arange(24, at::kDouble).view({8, 3})));
}

}  // namespace
}  // namespace dtensor::testing
