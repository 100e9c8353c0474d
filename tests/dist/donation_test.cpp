// Buffer donation: redistribute of a moved-in DTensor reuses its local buffer only when nothing else can
// see that buffer, and otherwise behaves exactly like the copying overload.

#include "harness.h"

namespace dtensor::testing {
namespace {

Placements all_partial(const MeshPtr& m) { return Placements(m->ndim(), Partial()); }
Placements all_replicate(const MeshPtr& m) { return Placements(m->ndim(), Replicate()); }

FromLocalOptions no_check(const at::Tensor& full) {
  FromLocalOptions options;
  options.run_check = false;
  options.shape = full.sizes().vec();
  options.stride = full.strides().vec();
  return options;
}

class DonationTest : public DistTest {};

TEST_F(DonationTest, DonatedPartialToReplicateReducesInTheDonatedBuffer) {
  const at::Tensor full = test_tensor({6, 5}, at::kFloat, 21);
  // 2x2: two all-reduces, both in the donated buffer.
  for (const auto& m : {mesh({4}), mesh({2, 2})}) {
    SCOPED_TRACE(m->str());
    at::Tensor dt = make_dtensor_holding(full, m, all_partial(m));
    const void* donated = local_tensor_of(dt).data_ptr();
    at::Tensor out = redistribute(std::move(dt), all_replicate(m));
    EXPECT_FALSE(dt.defined());  // NOLINT(bugprone-use-after-move): consuming the handle is the contract
    EXPECT_TRUE(tensors_equal(to_local(out), full));
    EXPECT_EQ(local_tensor_of(out).data_ptr(), donated);
  }
}

TEST_F(DonationTest, DonationFallsBackToCopyingWhenTheBufferIsShared) {
  const at::Tensor full = test_tensor({6, 5}, at::kFloat, 22);
  auto m = mesh({4});
  const at::Tensor contribution = local_tensor_of(make_dtensor_holding(full, m, {Partial()})).clone();
  auto donor = [&] { return from_local(contribution.clone(), m, {Partial()}, no_check(full)); };
  // One way each that something else reaches the local buffer: a second handle to the DTensor, a
  // DTensor alias sharing its local tensor (as autograd saves one), the tensor given to from_local,
  // and a view of the local tensor.
  at::Tensor with_handle = donor(), with_alias = donor(), with_view = donor();
  const at::Tensor handle = with_handle, alias = alias_without_history(with_alias);
  const at::Tensor view = to_local(with_view).view(-1);
  const at::Tensor given = contribution.clone();
  at::Tensor with_given = from_local(given, m, {Partial()}, no_check(full));
  for (at::Tensor* dt : {&with_handle, &with_alias, &with_view, &with_given}) {
    const void* buffer = local_tensor_of(*dt).data_ptr();
    at::Tensor out = redistribute(std::move(*dt), {Replicate()});
    EXPECT_TRUE(tensors_equal(to_local(out), full));
    EXPECT_NE(local_tensor_of(out).data_ptr(), buffer);
  }
  EXPECT_TRUE(tensors_equal(local_tensor_of(handle), contribution));
  EXPECT_TRUE(tensors_equal(local_tensor_of(alias), contribution));
  EXPECT_TRUE(tensors_equal(view, contribution.view(-1)));
  EXPECT_TRUE(tensors_equal(given, contribution));
}

TEST_F(DonationTest, DonationKeepsGradientsOfDTensorsRequiringGrad) {
  // The DTensor is the only holder of its buffer (from_local of a temporary), so it is donated even
  // though it requires grad: redistribute's backward needs none of its values.
  // loss = sum(X * C) with X the Partial(sum) value: dloss/dx_r = C.
  const at::Tensor x = test_tensor({3, 4}, at::kDouble, 23), c = test_tensor({3, 4}, at::kDouble, 24);
  auto m = mesh({4});
  at::Tensor contribution = local_tensor_of(make_dtensor_holding(x, m, {Partial()})).clone().requires_grad_();
  at::Tensor dt = from_local(contribution.clone(), m, {Partial()}, no_check(x));
  ASSERT_TRUE(dt.requires_grad());
  const void* buffer = local_tensor_of(dt).data_ptr();
  at::Tensor whole = to_local(redistribute(std::move(dt), {Replicate()}));
  EXPECT_EQ(whole.data_ptr(), buffer);
  EXPECT_TRUE(tensors_equal(whole, x));
  (whole * c).sum().backward();
  EXPECT_TRUE(tensors_equal(contribution.grad(), c));
}

// A DTensor an op saved for its backward is not donated: the node's handle is a second one. If it
// were, the saved contributions would read the reduced value and C's gradient would be 4X, not X.
// loss = sum(X) + sum(X * C): dloss/dC = X, dloss/dx_r = 1 + C.
TEST_F(DonationTest, DonationSkipsADTensorAnOpSavedForBackward) {
  const at::Tensor x = test_tensor({3, 4}, at::kDouble, 26), c_full = test_tensor({3, 4}, at::kDouble, 27);
  auto m = mesh({4});
  at::Tensor contribution = local_tensor_of(make_dtensor_holding(x, m, {Partial()})).clone().requires_grad_();
  at::Tensor dt = from_local(contribution.clone(), m, {Partial()}, no_check(x));
  at::Tensor c = distribute_tensor(c_full, m, Placements{Replicate()}).requires_grad_();
  const at::Tensor product = dt * c;  // Partial, and MulBackward keeps dt for c's gradient
  const void* buffer = local_tensor_of(dt).data_ptr();
  const at::Tensor whole = redistribute(std::move(dt), {Replicate()});
  EXPECT_NE(local_tensor_of(whole).data_ptr(), buffer);
  (full_tensor(whole).sum() + full_tensor(product).sum()).backward();
  EXPECT_TRUE(tensors_equal(full_tensor(c.grad()), x));
  EXPECT_TRUE(tensors_equal(contribution.grad(), 1 + c_full));
}

TEST_F(DonationTest, DonatedNonContiguousShardIsCopiedIntoAContiguousResult) {
  const at::Tensor full = test_tensor({4, 6}, at::kLong, 25);
  auto m = mesh({4});
  const at::Tensor contribution = local_tensor_of(make_dtensor_holding(full, m, {Partial()}));
  at::Tensor dt = from_local(contribution.t().contiguous().t(), m, {Partial()}, no_check(full));
  at::Tensor out = redistribute(std::move(dt), {Replicate()});
  EXPECT_TRUE(local_tensor_of(out).is_contiguous());
  EXPECT_TRUE(tensors_equal(to_local(out), full));
}

TEST_F(DonationTest, RefusedDonationLeavesTheHandle) {
  at::Tensor dt = make_dtensor_holding(test_tensor({4, 4}, at::kFloat, 26), mesh({4}), {Replicate()});
  EXPECT_THROW(redistribute(std::move(dt), {Partial()}), DTensorError);
  EXPECT_TRUE(dt.defined());  // NOLINT(bugprone-use-after-move): validation comes before consuming
}

}  // namespace
}  // namespace dtensor::testing
