// out= overloads on DTensors (add.out, mm.out, sort.values, ...): they share their functional form's
// rule, with each out tensor placed like the output it returns. The result lands in the caller's out
// DTensor, equal to the op on one device; an out tensor of the wrong shape is refused, since a
// DTensor's local buffer cannot be resized to a global shape.

#include "dtensor/comm_debug.h"
#include <gmock/gmock.h>

#include "harness.h"

namespace dtensor::testing {
namespace {

class OutFormsTest : public DistTest {};

// `out` on every mesh dim: Shard(dim) where the mesh has room, else Replicate.
Placements along(const MeshPtr& m, int64_t dim) { return Placements(m->ndim(), Shard(dim)); }

TEST_F(OutFormsTest, PointwiseAndMatmulWriteTheCallersOutTensor) {
  const at::Tensor x = test_tensor({5, 6}, at::kDouble, 1), y = test_tensor({5, 6}, at::kDouble, 2);
  const at::Tensor w = test_tensor({6, 3}, at::kDouble, 3);
  for (const auto& m : meshes()) {
    at::Tensor dx = distribute_tensor(x, m, along(m, 0)), dy = distribute_tensor(y, m, along(m, 0));
    at::Tensor out = distribute_tensor(at::zeros({5, 6}, at::kDouble), m, along(m, 0));
    at::Tensor& returned = at::add_out(out, dx, dy, 2);
    EXPECT_EQ(returned.unsafeGetTensorImpl(), out.unsafeGetTensorImpl());
    EXPECT_TRUE(tensors_equal(full_tensor(out), at::add(x, y, 2)));

    at::Tensor product = distribute_tensor(at::zeros({5, 3}, at::kDouble), m, along(m, 0));
    at::mm_out(product, dx, distribute_tensor(w, m, Placements(m->ndim(), Replicate())));
    EXPECT_TRUE(tensors_close(full_tensor(product), at::mm(x, w)));

    // An out tensor placed otherwise: the inputs move to where the out tensor is.
    at::Tensor replicated = distribute_tensor(at::zeros({5, 6}, at::kDouble), m, Placements(m->ndim(), Replicate()));
    at::mul_out(replicated, dx, dy);
    EXPECT_EQ(placements_of(replicated), Placements(m->ndim(), Replicate()));
    EXPECT_TRUE(tensors_equal(full_tensor(replicated), at::mul(x, y)));
  }
}

TEST_F(OutFormsTest, ReductionsScansAndSortsWithSeveralOutTensors) {
  const at::Tensor x = test_tensor({5, 7}, at::kDouble, 4);
  for (const auto& m : meshes()) {
    at::Tensor dx = distribute_tensor(x, m, along(m, 0));
    at::Tensor sum = distribute_tensor(at::zeros({5}, at::kDouble), m, along(m, 0));
    at::sum_out(sum, dx, {1});
    EXPECT_TRUE(tensors_close(full_tensor(sum), x.sum(1)));

    at::Tensor running = distribute_tensor(at::zeros({5, 7}, at::kDouble), m, along(m, 0));
    at::cumsum_out(running, dx, 1);
    EXPECT_TRUE(tensors_close(full_tensor(running), x.cumsum(1)));

    at::Tensor values = distribute_tensor(at::zeros({5, 7}, at::kDouble), m, along(m, 0));
    at::Tensor indices = distribute_tensor(at::zeros({5, 7}, at::kLong), m, along(m, 0));
    at::sort_out(values, indices, dx, 1, /*descending=*/true);
    const auto [expected_values, expected_indices] = x.sort(1, true);
    EXPECT_TRUE(tensors_equal(full_tensor(values), expected_values));
    EXPECT_TRUE(tensors_equal(full_tensor(indices), expected_indices));
  }
}

// Rules with a local kernel of their own (a mean over uneven shards divides by the global count; a
// max over a rank without rows has nothing to compare): the kernel's results land in the out tensor.
TEST_F(OutFormsTest, LocalKernelsWriteTheirResultsIntoTheOutTensor) {
  const at::Tensor x = test_tensor({5, 7}, at::kDouble, 6);  // 5 rows over 4 ranks: one rank has none
  const auto m = mesh({4});
  at::Tensor dx = distribute_tensor(x, m, Placements{Shard(0)});
  auto partial = [&](ReduceOp op) {
    return from_local(at::zeros({7}, at::kDouble), m, Placements{Partial(op)}, {.run_check = false});
  };
  at::Tensor mean = partial(ReduceOp::Sum);
  CommDebugMode debug;
  at::mean_out(mean, dx, {0});
  EXPECT_EQ(debug.total_count(), 0) << "the rows' partial sums stay on their ranks: " << debug.summary();
  EXPECT_EQ(placements_of(mean), (Placements{Partial(ReduceOp::Sum)}));
  EXPECT_TRUE(tensors_close(full_tensor(mean), x.mean(0)));
  at::Tensor largest = partial(ReduceOp::Max);
  at::amax_out(largest, dx, {0});
  EXPECT_TRUE(tensors_equal(full_tensor(largest), x.amax(0)));
}

TEST_F(OutFormsTest, AnOutTensorOfTheWrongShapeIsRefused) {
  const auto m = mesh({4});
  at::Tensor dx = distribute_tensor(test_tensor({5, 6}, at::kDouble, 5), m, Placements{Shard(0)});
  at::Tensor small = distribute_tensor(at::zeros({3, 6}, at::kDouble), m, Placements{Shard(0)});
  EXPECT_THAT(error_of([&] { at::add_out(small, dx, dx); }), ::testing::HasSubstr("DTensors do not resize out= tensors"));
}

}  // namespace
}  // namespace dtensor::testing
