// aten::linear on DTensors as one op (src/sharding/kernels/fused_linear.cpp): for every layout it takes,
// on a 1-d mesh of 4 and a 2x2 mesh with uneven shapes, the output and the three gradients equal
// single-device LibTorch's, with the placements the layout table gives, whatever layout the incoming
// gradient has; other layouts decompose; a gradient of the gradient (create_graph) is right too; and a
// tensor-parallel torch::nn::Linear called through dtensor::call runs as that one op.

#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/linear.h>

#include "dtensor/comm_debug.h"
#include "dtensor/parallel.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

struct LinearCase {
  Placements x, weight, bias;                            // bias empty: no bias
  Placements out, grad_x, grad_weight, grad_bias;        // what the fused op gives
};

struct Operands {
  at::Tensor x, weight, bias;  // single-device, integer-valued doubles: every sum is exact
};

Operands operands(const Shape& x_shape, int64_t out_features) {
  const int64_t in = x_shape.back();
  return {test_tensor(x_shape, at::kDouble, 1), test_tensor({out_features, in}, at::kDouble, 2),
          test_tensor({out_features}, at::kDouble, 3)};
}

at::Tensor leaf(const at::Tensor& full, const MeshPtr& m, const Placements& placements, uint64_t seed) {
  return make_dtensor_holding(full, m, placements, seed).requires_grad_();
}

// Runs linear on DTensors laid out as `c` (the gradient given as `grad_layout`) and compares everything
// with one device. `fused`: whether dtensor's one-op linear is expected to take it.
void check_linear(const MeshPtr& m, const Operands& o, const LinearCase& c, const Placements& grad_layout, bool fused) {
  SCOPED_TRACE("x " + to_string(c.x) + ", weight " + to_string(c.weight) + ", bias " +
               (c.bias.empty() ? std::string("none") : to_string(c.bias)) + ", gradient " + to_string(grad_layout));
  const bool has_bias = !c.bias.empty();
  at::Tensor x = o.x.clone().requires_grad_(), w = o.weight.clone().requires_grad_(),
             b = has_bias ? o.bias.clone().requires_grad_() : at::Tensor();
  const at::Tensor expected = at::linear(x, w, has_bias ? std::optional<at::Tensor>(b) : std::nullopt);
  const at::Tensor grad = test_tensor(expected.sizes().vec(), at::kDouble, 4);
  expected.backward(grad);

  at::Tensor dx = leaf(o.x, m, c.x, 5), dw = leaf(o.weight, m, c.weight, 6),
             db = has_bias ? leaf(o.bias, m, c.bias, 7) : at::Tensor();
  const at::Tensor out = at::linear(dx, dw, has_bias ? std::optional<at::Tensor>(db) : std::nullopt);
  ASSERT_TRUE(out.grad_fn());
  EXPECT_EQ(out.grad_fn()->name() == "dtensor::LinearBackward", fused) << out.grad_fn()->name();
  if (fused) EXPECT_EQ(to_string(placements_of(out)), to_string(c.out));
  EXPECT_TRUE(tensors_equal(full_tensor(out), expected));
  out.backward(make_dtensor_holding(grad, m, grad_layout, 8));
  EXPECT_TRUE(tensors_equal(full_tensor(dx.grad()), x.grad()));
  EXPECT_TRUE(tensors_equal(full_tensor(dw.grad()), w.grad()));
  if (has_bias) EXPECT_TRUE(tensors_equal(full_tensor(db.grad()), b.grad()));
  if (!fused) return;
  EXPECT_EQ(to_string(placements_of(dx.grad())), to_string(c.grad_x));
  EXPECT_EQ(to_string(placements_of(dw.grad())), to_string(c.grad_weight));
  if (has_bias) EXPECT_EQ(to_string(placements_of(db.grad())), to_string(c.grad_bias));
}

class FusedLinearTest : public DistTest {};

TEST_F(FusedLinearTest, FusedLinearTakesEveryShardLocalLayoutOnOneMeshDim) {
  auto m = mesh({4});
  // Uneven everywhere over 4 ranks: batch 3, sequence 5, 7 input and 6 output features.
  const Operands o = operands({3, 5, 7}, 6);
  const Placements R = {Replicate()}, P = {Partial()};
  const std::vector<LinearCase> cases = {
      {R, R, R, R, R, R, R},
      {{Shard(0)}, R, R, {Shard(0)}, {Shard(0)}, P, P},
      {{Shard(1)}, R, R, {Shard(1)}, {Shard(1)}, P, P},
      {R, {Shard(0)}, {Shard(0)}, {Shard(2)}, P, {Shard(0)}, {Shard(0)}},   // column parallel
      {R, {Shard(0)}, {}, {Shard(2)}, P, {Shard(0)}, {}},
      {{Shard(2)}, {Shard(1)}, R, P, {Shard(2)}, {Shard(1)}, R},            // row parallel
      {{Shard(2)}, {Shard(1)}, {}, P, {Shard(2)}, {Shard(1)}, {}},
  };
  for (const LinearCase& c : cases) {
    // The gradient as the layout wants it (no communication), and as Replicate (sliced) or Partial
    // (reduced) when it arrives otherwise.
    check_linear(m, o, c, partial_as_replicate(c.out), /*fused=*/true);
    check_linear(m, o, c, R, /*fused=*/true);
    check_linear(m, o, c, P, /*fused=*/true);
  }
}

TEST_F(FusedLinearTest, FusedLinearTakesMixedLayoutsOnATwoByTwoMesh) {
  auto m = mesh({2, 2});
  const Operands o = operands({5, 3, 7}, 6);
  const Placements RR = {Replicate(), Replicate()};
  const std::vector<LinearCase> cases = {
      // data parallel x column parallel, data parallel x row parallel
      {{Shard(0), Replicate()}, {Replicate(), Shard(0)}, {Replicate(), Shard(0)}, {Shard(0), Shard(2)},
       {Shard(0), Partial()}, {Partial(), Shard(0)}, {Partial(), Shard(0)}},
      {{Shard(0), Shard(2)}, {Replicate(), Shard(1)}, RR, {Shard(0), Partial()}, {Shard(0), Shard(2)},
       {Partial(), Shard(1)}, {Partial(), Replicate()}},
      // column parallel on one dim and row parallel on the other: the bias is added on coordinate 0
      // of the row-parallel dim only
      {{Replicate(), Shard(2)}, {Shard(0), Shard(1)}, {Shard(0), Replicate()}, {Shard(2), Partial()},
       {Partial(), Shard(2)}, {Shard(0), Shard(1)}, {Shard(0), Replicate()}},
      // both dims sharding the output features (nested chunks of weight rows and output columns)
      {RR, {Shard(0), Shard(0)}, {Shard(0), Shard(0)}, {Shard(2), Shard(2)}, {Partial(), Partial()},
       {Shard(0), Shard(0)}, {Shard(0), Shard(0)}},
  };
  for (const LinearCase& c : cases) {
    check_linear(m, o, c, partial_as_replicate(c.out), /*fused=*/true);
    check_linear(m, o, c, RR, /*fused=*/true);
  }
}

TEST_F(FusedLinearTest, FusedLinearTakesAVectorInput) {
  auto m = mesh({4});
  const Operands o = operands({7}, 6);
  check_linear(m, o, {{Replicate()}, {Shard(0)}, {Shard(0)}, {Shard(0)}, {Partial()}, {Shard(0)}, {Shard(0)}},
               {Replicate()}, /*fused=*/true);
  check_linear(m, o, {{Shard(0)}, {Shard(1)}, {Replicate()}, {Partial()}, {Shard(0)}, {Shard(1)}, {Replicate()}},
               {Replicate()}, /*fused=*/true);
}

TEST_F(FusedLinearTest, LinearLayoutsThatNeedCommunicationDecompose) {
  auto m = mesh({4});
  const Operands o = operands({3, 5, 7}, 6);
  const Placements R = {Replicate()};
  // A Partial input, a weight sharded against a replicated input's features, a bias laid out unlike
  // the output: each needs data from another rank, which the decomposed ops' rules bring.
  for (const LinearCase& c : std::vector<LinearCase>{{{Partial()}, R, {}, {}, {}, {}, {}},
                                                     {R, {Shard(1)}, R, {}, {}, {}, {}},
                                                     {R, {Shard(0)}, R, {}, {}, {}, {}},
                                                     {{Shard(2)}, {Shard(1)}, {Shard(0)}, {}, {}, {}, {}}})
    check_linear(m, o, c, R, /*fused=*/false);
}

// A gradient of the gradient: backward under create_graph runs the DTensor ops themselves, so the
// first derivative is differentiable again.
TEST_F(FusedLinearTest, FusedLinearGradientIsDifferentiable) {
  auto m = mesh({4});
  const Operands o = operands({3, 5, 7}, 6);
  at::Tensor x = o.x.clone().requires_grad_(), w = o.weight.clone().requires_grad_();
  const at::Tensor y = at::linear(x, w, o.bias);
  const at::Tensor gx = torch::autograd::grad({(y * y).sum()}, {x}, {}, std::nullopt, /*create_graph=*/true)[0];
  (gx * gx).sum().backward();

  at::Tensor dx = leaf(o.x, m, {Replicate()}, 5), dw = leaf(o.weight, m, {Shard(0)}, 6);
  const at::Tensor dy = at::linear(dx, dw, distribute_tensor(o.bias, m, Placements{Shard(0)}));
  ASSERT_EQ(dy.grad_fn()->name(), "dtensor::LinearBackward");
  const at::Tensor dgx = torch::autograd::grad({(dy * dy).sum()}, {dx}, {}, std::nullopt, /*create_graph=*/true)[0];
  EXPECT_TRUE(tensors_equal(full_tensor(dgx), gx));
  (dgx * dgx).sum().backward();
  EXPECT_TRUE(tensors_equal(full_tensor(dx.grad()), x.grad()));
  EXPECT_TRUE(tensors_equal(full_tensor(dw.grad()), w.grad()));
}

TEST_F(FusedLinearTest, FusedLinearWithoutGradModeRecordsNothing) {
  auto m = mesh({4});
  const Operands o = operands({3, 5, 7}, 6);
  at::NoGradGuard no_grad;
  const at::Tensor out = at::linear(leaf(o.x, m, {Replicate()}, 5), leaf(o.weight, m, {Shard(0)}, 6));
  EXPECT_FALSE(out.grad_fn());
  EXPECT_TRUE(tensors_equal(full_tensor(out), at::linear(o.x, o.weight)));
}

// A frozen weight: only x's gradient is needed, so the node keeps the weight and not x, and x may be
// changed in place after the forward (LibTorch's own linear allows it too).
TEST_F(FusedLinearTest, FusedLinearWithAFrozenWeightKeepsNoActivation) {
  auto m = mesh({4});
  const Operands o = operands({3, 5, 7}, 6);
  at::Tensor x = o.x.clone().requires_grad_();
  at::Tensor x2 = x * 1;
  const at::Tensor y = at::linear(x2, o.weight, o.bias);
  x2.mul_(2);
  const at::Tensor grad = test_tensor(y.sizes().vec(), at::kDouble, 4);
  y.backward(grad);

  at::Tensor dx = leaf(o.x, m, {Replicate()}, 5);
  at::Tensor dx2 = dx * 1;
  const at::Tensor dy = at::linear(dx2, distribute_tensor(o.weight, m, Placements{Shard(0)}),
                                   distribute_tensor(o.bias, m, Placements{Shard(0)}));
  ASSERT_EQ(dy.grad_fn()->name(), "dtensor::LinearBackward");
  EXPECT_EQ(dx2.use_count(), 1);  // the node did not keep it
  dx2.mul_(2);
  dy.backward(distribute_tensor(grad, m, Placements{Shard(2)}));
  EXPECT_TRUE(tensors_equal(full_tensor(dx.grad()), x.grad()));
}

// Complex operands decompose: their gradients conjugate the other operand, as LibTorch's formulas do.
TEST_F(FusedLinearTest, FusedLinearLeavesComplexOperandsToTheComposite) {
  auto m = mesh({4});
  const at::Tensor x = at::complex(test_tensor({3, 7}, at::kDouble, 1), test_tensor({3, 7}, at::kDouble, 2));
  const at::Tensor w = at::complex(test_tensor({6, 7}, at::kDouble, 3), test_tensor({6, 7}, at::kDouble, 4));
  at::Tensor x1 = x.clone().requires_grad_(), w1 = w.clone().requires_grad_();
  at::linear(x1, w1).abs().sum().backward();
  at::Tensor dx = distribute_tensor(x, m, Placements{Replicate()}).requires_grad_();
  at::Tensor dw = distribute_tensor(w, m, Placements{Shard(0)}).requires_grad_();
  const at::Tensor dy = at::linear(dx, dw);
  EXPECT_NE(dy.grad_fn()->name(), "dtensor::LinearBackward");
  full_tensor(dy).abs().sum().backward();
  EXPECT_TRUE(tensors_close(full_tensor(dx.grad()), x1.grad(), 1e-12, 1e-9));
  EXPECT_TRUE(tensors_close(full_tensor(dw.grad()), w1.grad(), 1e-12, 1e-9));
}

// Shapes that do not multiply fail on every rank, as one device refuses them, instead of passing on
// the ranks whose shards happen to broadcast (a bias of 4 against 8 output features, cut in 4).
TEST_F(FusedLinearTest, FusedLinearRefusesShapesThatDoNotMultiplyOnEveryRank) {
  auto m = mesh({4});
  const at::Tensor x = distribute_tensor(test_tensor({3, 7}, at::kDouble, 1), m, Placements{Replicate()});
  const at::Tensor w = distribute_tensor(test_tensor({8, 7}, at::kDouble, 2), m, Placements{Shard(0)});
  const at::Tensor b = distribute_tensor(test_tensor({4}, at::kDouble, 3), m, Placements{Shard(0)});
  EXPECT_THROW(at::linear(x, w, b), std::exception);
  const at::Tensor rows = distribute_tensor(test_tensor({3, 8}, at::kDouble, 4), m, Placements{Shard(1)});
  const at::Tensor w_rows = distribute_tensor(test_tensor({6, 7}, at::kDouble, 5), m, Placements{Shard(1)});
  EXPECT_THROW(at::linear(rows, w_rows), std::exception);
}

// The module path: dtensor::call runs a parallel torch::nn::Linear as one aten::linear on DTensors,
// forward and backward, with the single device's values.
TEST_F(FusedLinearTest, ParallelLinearModuleRunsAsOneDTensorOp) {
  auto m = mesh({4});
  torch::nn::Linear colwise(7, 6), rowwise(6, 7);
  {  // the same parameters on every rank
    at::NoGradGuard no_grad;
    uint64_t seed = 10;
    for (torch::nn::Linear* layer : {&colwise, &rowwise}) {
      (*layer)->to(at::kDouble);
      for (at::Tensor& p : (*layer)->parameters()) p.copy_(test_tensor(p.sizes().vec(), at::kDouble, seed++));
    }
  }
  const at::Tensor x = test_tensor({3, 5, 7}, at::kDouble, 1), grad = test_tensor({3, 5, 7}, at::kDouble, 2);
  rowwise(colwise(x)).backward(grad);
  const std::vector<at::Tensor> expected_grads = {colwise->weight.grad(), colwise->bias.grad(), rowwise->weight.grad(),
                                                  rowwise->bias.grad()};
  const at::Tensor expected = rowwise(colwise(x)).detach();
  parallelize_module(*colwise, m, {{"", ColwiseParallel{}}});
  parallelize_module(*rowwise, m, {{"", RowwiseParallel{}}});

  CommDebugMode debug;
  const at::Tensor out = call(rowwise, call(colwise, x));
  const std::vector<std::string> ops = debug.ops();
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::linear"), 2);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::mm") + std::count(ops.begin(), ops.end(), "aten::t"), 0);
  EXPECT_TRUE(tensors_close(out, expected, 1e-12, 1e-9));
  out.backward(grad);
  const std::vector<at::Tensor> grads = {colwise->weight.grad(), colwise->bias.grad(), rowwise->weight.grad(),
                                         rowwise->bias.grad()};
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(tensors_close(full_tensor(grads[i]), expected_grads[i], 1e-12, 1e-9)) << i;
  for (const auto& op : debug.ops()) EXPECT_NE(op, "aten::mm");  // backward too: no DTensor matmul
}

}  // namespace
}  // namespace dtensor::testing
