// Ops on Partial DTensors give the values single-device LibTorch gives the reduced tensor: linear ops
// keep Partial only where they are linear (not division with rounding, not integer averages, not an
// out= argument), everything else reduces its inputs first, and in-place ops reduce the tensor they
// write to in its own buffer.

#include "dtensor/comm_debug.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;

// The example: 4 ranks each hold 0.75 of a value of 3.
at::Tensor quarters_of_three(const MeshPtr& m) {
  FromLocalOptions options;
  options.run_check = false;
  return from_local(at::full({2}, 0.75, at::kDouble), m, {Partial()}, options);
}

class PartialTest : public DistTest {};

TEST_F(PartialTest, DivisionWithRoundingOfAPartialSumRoundsTheSum) {
  auto m = mesh({4});
  const at::Tensor three = at::full({2}, 3.0, at::kDouble), divisor = at::full({2}, 3.0, at::kDouble);
  for (const char* mode : {"floor", "trunc"}) {
    SCOPED_TRACE(mode);
    EXPECT_TRUE(tensors_equal(full_tensor(at::div(quarters_of_three(m), 3, mode)), at::div(three, 3, mode)));
    at::Tensor d = distribute_tensor(divisor, m);
    EXPECT_TRUE(tensors_equal(full_tensor(at::div(quarters_of_three(m), d, mode)), at::div(three, divisor, mode)));
    // In place: the written tensor is reduced in its own buffer first and ends up Replicate.
    at::Tensor p = quarters_of_three(m);
    p.div_(3, mode);
    EXPECT_EQ(placements_of(p), (Placements{Replicate()}));
    EXPECT_TRUE(tensors_equal(full_tensor(p), at::div(three, 3, mode)));
    at::Tensor q = quarters_of_three(m);
    q.div_(d, mode);
    EXPECT_TRUE(tensors_equal(full_tensor(q), at::div(three, divisor, mode)));
  }
  // True division stays linear: no communication, still Partial.
  CommDebugMode debug;
  at::Tensor exact = at::div(quarters_of_three(m), 3);
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  EXPECT_EQ(placements_of(exact), (Placements{Partial()}));
  EXPECT_TRUE(tensors_close(full_tensor(exact), three / 3));
}

TEST_F(PartialTest, NonlinearOpsReduceAPartialFirst) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({5, 3}, at::kDouble, 11), y = test_tensor({5, 3}, at::kDouble, 12).abs() + 1;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    SCOPED_TRACE(Partial(op).str());
    at::Tensor p = make_dtensor_holding(x, m, {Partial(op)}, 5);
    at::Tensor d = distribute_tensor(y, m);
    EXPECT_TRUE(tensors_equal(full_tensor(at::floor_divide(p, d)), at::floor_divide(x, y)));
    EXPECT_TRUE(tensors_equal(full_tensor(at::remainder(p, 3)), at::remainder(x, 3)));
    EXPECT_TRUE(tensors_equal(full_tensor(at::pow(p, 2)), at::pow(x, 2)));
    EXPECT_TRUE(tensors_equal(full_tensor(at::pow(d, p)), at::pow(y, x)));
    at::Tensor written = make_dtensor_holding(x, m, {Partial(op)}, 6);
    written.exp_();
    EXPECT_TRUE(tensors_close(full_tensor(written), x.exp()));
  }
}

TEST_F(PartialTest, IntegerAverageIsNotLinear) {
  // Contributions 3, 2, 2, 2 average (truncating) to 2. Scaled by 5 first, they would average
  // 45 / 4 -> 11 instead of 10; summed over 5 elements first, likewise.
  auto m = mesh({4});
  FromLocalOptions options;
  options.run_check = false;
  const int64_t mine = world()->rank() == 0 ? 3 : 2;
  at::Tensor p = from_local(at::full({5}, mine, at::kLong), m, {Partial(ReduceOp::Avg)}, options);
  EXPECT_TRUE(tensors_equal(full_tensor(p), at::full({5}, 2, at::kLong)));
  EXPECT_TRUE(tensors_equal(full_tensor(p * 5), at::full({5}, 10, at::kLong)));
  EXPECT_TRUE(tensors_equal(full_tensor(p.sum()), at::scalar_tensor(10, at::kLong)));
}

TEST_F(PartialTest, OutArgumentReceivesTheResultNotAContribution) {
  auto m = mesh({4});
  const at::Tensor x = test_tensor({5, 3}, at::kDouble, 13), y = test_tensor({5, 3}, at::kDouble, 14);
  at::Tensor out = make_dtensor_holding(at::zeros({5, 3}, at::kDouble), m, {Partial()}, 3);
  at::mul_out(out, distribute_tensor(x, m), distribute_tensor(y, m));
  EXPECT_TRUE(tensors_equal(full_tensor(out), x * y));
}

TEST_F(PartialTest, InPlaceOpOnAPartialWhoseBufferIsSharedIsRefused) {
  auto m = mesh({4});
  at::Tensor p = make_dtensor_holding(test_tensor({4}, at::kDouble, 15), m, {Partial()}, 4);
  at::Tensor view = p.view({2, 2});  // shares p's local buffer and would see it reduced
  EXPECT_THAT(error_of([&] { p.floor_divide_(2); }), HasSubstr("its local buffer is shared"));
}

TEST_F(PartialTest, InPlaceViewsReshapeTheDTensor) {
  auto m = mesh({2, 2});
  const at::Tensor x = test_tensor({5, 1, 3}, at::kDouble, 16);
  at::Tensor dt = distribute_tensor(x, m, Placements{Shard(0), Shard(2)});
  dt.squeeze_(1);
  EXPECT_EQ(placements_of(dt), (Placements{Shard(0), Shard(1)}));
  EXPECT_TRUE(tensors_equal(full_tensor(dt), x.squeeze(1)));
  dt.t_();
  EXPECT_EQ(dt.sizes().vec(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(placements_of(dt), (Placements{Shard(1), Shard(0)}));
  EXPECT_TRUE(tensors_equal(full_tensor(dt), x.squeeze(1).t()));
  dt.unsqueeze_(0);
  EXPECT_TRUE(tensors_equal(full_tensor(dt), x.squeeze(1).t().unsqueeze(0)));
  // A sharded size-1 dim cannot be squeezed away in place: its data would have to move.
  at::Tensor one = distribute_tensor(at::zeros({1, 4}), mesh({4}), Placements{Shard(0)});
  EXPECT_THAT(error_of([&] { one.squeeze_(0); }), HasSubstr("keeps the placements of the tensor it writes to"));
}

}  // namespace
}  // namespace dtensor::testing
