// StridedShard on real ranks: a view merging a sharded dim into the dims before it sends nothing and
// makes a StridedShard, ops that treat indices on their own keep it without communication, the view
// back gives the Shard again, and every result (values, gradients, redistributions into and out of
// it) equals single-device LibTorch on the full tensors. Each rank's shard is checked against
// torch.chunk of every block of the full tensor, not against dtensor's own layout code.

#include <ATen/ATen.h>

#include "dtensor/comm_debug.h"
#include "dtensor/errors.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

int64_t coordinate(const MeshPtr& m, int64_t dim = 0) { return (*m->coordinate())[dim]; }

struct Merge {
  Shape in;
  int64_t sharded;
  Shape out;
  int64_t blocks;  // the StridedShard the merge makes along output dim 0
};

// [8,12] S(1) -> [96] is PyTorch's own example; [3,5,4] S(1) -> [15,4] has uneven shards (5 over 4
// ranks: 2, 2, 1, 0) and a dim after the merge; [2,3,8] S(2) -> [48] merges two dims before it.
const std::vector<Merge> kMerges = {{{8, 12}, 1, {96}, 8}, {{3, 5, 4}, 1, {15, 4}, 3}, {{2, 3, 8}, 2, {48}, 6}};

class StridedShardTest : public DistTest {};

TEST_F(StridedShardTest, StridedShardMergingAShardedDimSendsNothingAndViewsBack) {
  auto m = mesh({4});
  for (const Merge& c : kMerges) {
    const at::Tensor x = test_tensor(c.in, at::kDouble, 11);
    const at::Tensor dx = distribute_tensor(x, m, Placements{Shard(c.sharded)});
    at::Tensor y, back;
    {
      CommDebugMode debug;
      y = dx.view(c.out);
      back = y.view(c.in);
      EXPECT_EQ(debug.total_count(), 0) << debug.summary();
    }
    EXPECT_EQ(placements_of(y), (Placements{StridedShard(0, c.blocks)})) << shape_str(c.in);
    EXPECT_EQ(placements_of(back), (Placements{Shard(c.sharded)}));
    EXPECT_TRUE(to_local(y).is_alias_of(to_local(dx)));
    EXPECT_TRUE(tensors_equal(to_local(y), strided_piece(x.view(c.out), 0, c.blocks, 4, coordinate(m))));
    EXPECT_TRUE(tensors_equal(full_tensor(y), x.view(c.out)));
    EXPECT_TRUE(tensors_equal(full_tensor(back), x));
    // reshape takes the same route.
    CommDebugMode debug;
    EXPECT_EQ(placements_of(dx.reshape(c.out)), placements_of(y));
    EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  }
}

// [3,6,4] S(1) -> [72]: chunks of 6 rows of 4 over 4 ranks (8, 8, 8, 0 elements per block) are not
// torch.chunk pieces of a block of 24 (6 each), so the dim is gathered first, as before.
TEST_F(StridedShardTest, StridedShardMisalignedMergeStillReplicates) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({3, 6, 4}, at::kDouble, 12);
  const at::Tensor dx = distribute_tensor(x, m, Placements{Shard(1)});
  CommDebugMode debug;
  const at::Tensor y = dx.view({72});
  EXPECT_EQ(debug.count("all-gather"), 1) << debug.summary();
  EXPECT_EQ(placements_of(y), (Placements{Replicate()}));
  EXPECT_TRUE(tensors_equal(full_tensor(y), x.view({72})));
}

// Ops that treat every row on its own keep the strided rows as they are, with no communication;
// reducing over them gives a Partial. Every result equals the op on the full tensors.
TEST_F(StridedShardTest, StridedShardStaysThroughRowWiseOpsWithoutCommunication) {
  auto m = mesh({4});
  const at::Tensor a = test_tensor({3, 5, 4}, at::kDouble, 13), b = test_tensor({3, 5, 4}, at::kDouble, 14);
  const at::Tensor w = test_tensor({4, 6}, at::kDouble, 15);
  const at::Tensor da = distribute_tensor(a, m, Placements{Shard(1)}).view({15, 4});
  const at::Tensor db = distribute_tensor(b, m, Placements{Shard(1)}).view({15, 4});
  const at::Tensor dw = distribute_tensor(w, m);
  const at::Tensor fa = a.view({15, 4}), fb = b.view({15, 4});
  const Placements rows = {StridedShard(0, 3)};
  struct Case {
    std::string name;
    at::Tensor result, expected;
    Placements placements;
  };
  std::vector<Case> cases;
  {
    CommDebugMode debug;
    cases = {
        {"add", da + db, fa + fb, rows},
        {"mul scalar", da * 3, fa * 3, rows},
        {"relu", at::relu(da - db), at::relu(fa - fb), rows},
        {"mm", at::mm(da, dw), at::mm(fa, w), rows},
        {"sum over columns", da.sum(1), fa.sum(1), rows},
        {"sum over rows", da.sum(0), fa.sum(0), {Partial()}},
        {"softmax over columns", at::softmax(da, 1), at::softmax(fa, 1), rows},
        {"layer_norm", at::layer_norm(da, {4}), at::layer_norm(fa, {4}), rows},
        {"cumsum over columns", at::cumsum(da, 1), at::cumsum(fa, 1), rows},
        {"transpose", da.t(), fa.t(), {StridedShard(1, 3)}},
    };
    EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  }
  for (const Case& c : cases) {
    EXPECT_EQ(placements_of(c.result), c.placements) << c.name;
    EXPECT_TRUE(tensors_close(full_tensor(c.result), c.expected)) << c.name;
  }
}

// Ops that need more than each row on its own: a scan along the rows and a view that cannot keep the
// runs (gathered first), a mean over them (local sums over the global count), and an operand sharded
// plainly (one of the two is moved). Each equals the op on the full tensors.
TEST_F(StridedShardTest, StridedShardWithOpsOverTheRowsComputesTheRightValues) {
  auto m = mesh({4});
  const at::Tensor a = test_tensor({3, 5, 4}, at::kDouble, 16), c = test_tensor({15, 4}, at::kDouble, 17);
  const at::Tensor da = distribute_tensor(a, m, Placements{Shard(1)}).view({15, 4});
  const at::Tensor fa = a.view({15, 4});
  EXPECT_TRUE(tensors_close(full_tensor(at::cumsum(da, 0)), at::cumsum(fa, 0)));
  EXPECT_TRUE(tensors_close(full_tensor(da.mean(0)), fa.mean(0)));
  EXPECT_TRUE(tensors_close(full_tensor(da + distribute_tensor(c, m, Placements{Shard(0)})), fa + c));
  EXPECT_TRUE(tensors_close(full_tensor(da.view({60})), fa.view({60})));
}

TEST_F(StridedShardTest, StridedShardRedistributesToAndFromEveryPlacement) {
  auto m = mesh({4});
  for (const Merge& c : kMerges) {
    const at::Tensor x = test_tensor(c.out, at::kDouble, 18);
    const Placement strided = StridedShard(0, c.blocks);
    const at::Tensor piece = strided_piece(x, 0, c.blocks, 4, coordinate(m));
    const at::Tensor dx = distribute_tensor(x, m, Placements{strided});
    EXPECT_TRUE(tensors_equal(to_local(dx), piece)) << shape_str(c.out);
    const std::vector<Placements> others = {{Replicate()}, {Shard(0)}, {Shard(-1)}};
    for (const Placements& other : others) {
      EXPECT_TRUE(tensors_equal(to_local(redistribute(dx, other)), expected_shard(x, m, other))) << to_string(other);
      EXPECT_TRUE(tensors_equal(to_local(redistribute(distribute_tensor(x, m, other), Placements{strided})), piece))
          << to_string(other);
    }
    EXPECT_TRUE(tensors_equal(to_local(redistribute(make_dtensor_holding(x, m, {Partial()}, 3), Placements{strided})), piece));
    // from_local with run_check finds the global shape from the pieces.
    const at::Tensor back = from_local(piece, m, {strided});
    EXPECT_EQ(back.sizes().vec(), c.out);
    EXPECT_TRUE(tensors_equal(full_tensor(back), x));
  }
  // Pieces that are not torch.chunk pieces of every block are refused, naming the blocks.
  const at::Tensor wrong = at::zeros({coordinate(m) == 0 ? 4 : 3}, at::kDouble);
  const std::string error = error_of([&] { from_local(wrong, m, {StridedShard(0, 3)}); });
  EXPECT_NE(error.find("(of each of its blocks)"), std::string::npos) << error;
}

// On a 2x2 mesh: [4,6,10] with dim 2 over the first mesh dim and dim 1 over the second, viewed as
// [24,10]: dim 2 stays a Shard, dim 1 becomes a StridedShard of 4 blocks. Nothing is sent.
TEST_F(StridedShardTest, StridedShardOnTwoDimMesh) {
  auto m = mesh({2, 2});
  const at::Tensor x = test_tensor({4, 6, 10}, at::kDouble, 19);
  const at::Tensor dx = distribute_tensor(x, m, Placements{Shard(2), Shard(1)});
  at::Tensor y, z;
  {
    CommDebugMode debug;
    y = dx.view({24, 10});
    z = at::tanh(y) * 2;
    EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  }
  EXPECT_EQ(placements_of(z), (Placements{Shard(1), StridedShard(0, 4)}));
  const at::Tensor columns = x.view({24, 10}).chunk(2, 1)[coordinate(m, 0)];
  EXPECT_TRUE(tensors_equal(to_local(y), strided_piece(columns, 0, 4, 2, coordinate(m, 1))));
  EXPECT_TRUE(tensors_close(full_tensor(z), at::tanh(x.view({24, 10})) * 2));
  EXPECT_TRUE(tensors_close(full_tensor(z.view({4, 6, 10})), at::tanh(x) * 2));
  EXPECT_TRUE(tensors_equal(full_tensor(redistribute(y, Placements{Replicate(), Shard(0)})), x.view({24, 10})));
}

// Gradients flow back through the merge, the strided rows and the split: x -> view -> mm -> relu ->
// view back -> loss, against autograd on the full tensors.
TEST_F(StridedShardTest, StridedShardGradientsMatchOneDevice) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({3, 5, 4}, at::kDouble, 20), w = test_tensor({4, 4}, at::kDouble, 21);
  const at::Tensor c = test_tensor({3, 5, 4}, at::kDouble, 22);
  const at::Tensor dx = distribute_tensor(x, m, Placements{Shard(1)}).requires_grad_();
  const at::Tensor dw = distribute_tensor(w, m).requires_grad_();
  const at::Tensor hidden = at::relu(at::mm(dx.view({15, 4}), dw)).view({3, 5, 4});
  EXPECT_EQ(placements_of(hidden), (Placements{Shard(1)}));
  (hidden * distribute_tensor(c, m, Placements{Shard(1)})).sum().backward();

  const at::Tensor fx = x.clone().requires_grad_(), fw = w.clone().requires_grad_();
  (at::relu(at::mm(fx.view({15, 4}), fw)).view({3, 5, 4}) * c).sum().backward();
  EXPECT_TRUE(tensors_close(full_tensor(dx.grad()), fx.grad()));
  EXPECT_TRUE(tensors_close(full_tensor(dw.grad()), fw.grad()));
}

}  // namespace
}  // namespace dtensor::testing
