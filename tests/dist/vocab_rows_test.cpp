// Lookups into a row-sharded table (the vocabulary split over ranks, 2, 2, 1, 0 rows of 5 over 4
// ranks): each rank looks up only its rows, whatever the index dtype and however the indices fall,
// and an index outside the table fails as single-device LibTorch's lookup does, never masked away.

#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRows = 5;

// Forward and the table's gradient against single-device LibTorch.
void expect_lookup_matches(const at::Tensor& indices, int64_t padding_idx, bool scale_grad_by_freq) {
  auto m = mesh({4});
  const at::Tensor table = test_tensor({kRows, 3}, at::kDouble, 41);
  const at::Tensor grad = test_tensor({indices.size(0), 3}, at::kDouble, 42);
  const at::Tensor full = table.clone().requires_grad_();
  const at::Tensor expected = at::embedding(full, indices, padding_idx, scale_grad_by_freq);
  expected.backward(grad);

  at::Tensor sharded = distribute_tensor(table.clone().requires_grad_(), m, Placements{Shard(0)});
  const at::Tensor actual = at::embedding(sharded, distribute_tensor(indices, m), padding_idx, scale_grad_by_freq);
  actual.backward(distribute_tensor(grad, m));
  EXPECT_TRUE(tensors_close(full_tensor(actual), expected, 0, 0));
  EXPECT_EQ(placements_of(sharded.grad()), (Placements{Shard(0)}));
  EXPECT_TRUE(tensors_close(full_tensor(sharded.grad()), full.grad(), 1e-12, 1e-12));
}

class VocabRowsTest : public DistTest {};

TEST_F(VocabRowsTest, RowShardedLookupWithEveryIndexOnOneRank) {
  // Rank 0 holds every looked-up row (it masks nothing), the others none (they mask everything).
  expect_lookup_matches(at::tensor({1, 0, 1, 1}, at::kLong), -1, false);
}

TEST_F(VocabRowsTest, RowShardedLookupWithInt32IndicesPaddingAndFrequencyScaling) {
  expect_lookup_matches(at::tensor({4, 2, 2, 0, 3, 2}, at::kInt), /*padding_idx=*/3, /*scale_grad_by_freq=*/true);
}

TEST_F(VocabRowsTest, RowShardedLookupRefusesAnIndexOutsideTheTable) {
  auto m = mesh({4});
  const at::Tensor table = distribute_tensor(at::zeros({kRows, 3}), m, Placements{Shard(0)});
  for (const at::Tensor& indices : {at::tensor({0, 5}, at::kLong), at::tensor({-1, 2}, at::kInt)}) {
    EXPECT_THAT(error_of([&] { at::embedding(table, distribute_tensor(indices, m)); }),
                HasSubstr("embedding: an index lies outside the table's 5 rows"));
    const at::Tensor grad = distribute_tensor(at::ones({2, 3}), m);
    EXPECT_THAT(error_of([&] { at::embedding_dense_backward(grad, distribute_tensor(indices, m), kRows, -1, false); }),
                HasSubstr("embedding_dense_backward: an index lies outside the table's 5 rows"));
  }
  // Indices of a dtype no lookup takes fail with a message that says so (the forward's own shape check
  // already refuses them; the gradient, which has no Meta kernel, reaches the row lookup).
  const at::Tensor byte_indices = distribute_tensor(at::tensor({0, 1}, at::kByte), m);
  EXPECT_THAT(error_of([&] { at::embedding(table, byte_indices); }), HasSubstr("scalar types: Long, Int"));
  EXPECT_THAT(error_of([&] {
                at::embedding_dense_backward(distribute_tensor(at::ones({2, 3}), m), byte_indices, kRows, -1, false);
              }),
              HasSubstr("indices must be int64 or int32, as LibTorch's embedding and cross_entropy require; got Byte"));
}

}  // namespace
}  // namespace dtensor::testing
