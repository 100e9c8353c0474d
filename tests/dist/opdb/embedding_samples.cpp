// Samples for the embedding family: a table of 5 rows (2, 2, 1, 0 over 4 ranks: one rank holds no
// rows) and 3 columns, looked up by [2, 5] indices that repeat some rows and include every row.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

constexpr int64_t kRows = 5;

// The indices (input 1) are fixed int64 values; other inputs are the default integer-valued doubles.
at::Tensor lookup_input(size_t i, const Shape& shape) {
  if (i == 1) return at::tensor({1, 2, 4, 2, 0, 4, 4, 3, 2, 1}, at::kLong).reshape(shape);
  return test_tensor(shape, at::kDouble, 500 + i);
}

// A lookup is linear in the table, so a Partial table is tried as well.
OpSample lookup(std::string name, std::function<at::Tensor(In)> call, bool two_d = false) {
  return {.name = std::move(name),
          .shapes = {{kRows, 3}, {2, 5}},
          .run = [call](In x) { return outputs(call(x)); },
          .make_input = lookup_input,
          .placements = {{Replicate(), Shard(0), Shard(1), Partial()}, {Replicate(), Shard(0), Shard(1)}},
          .two_d = two_d};
}

// Its gradient is linear in grad_output: a Partial one is tried as well.
OpSample gradient(std::string name, int64_t padding_idx, bool scale_grad_by_freq) {
  return {.name = std::move(name),
          .shapes = {{2, 5, 3}, {2, 5}},
          .run = [=](In x) {
            return outputs(at::embedding_dense_backward(x[0], x[1], kRows, padding_idx, scale_grad_by_freq));
          },
          .make_input = lookup_input,
          .placements = {{Replicate(), Shard(0), Shard(1), Shard(2), Partial()}, {Replicate(), Shard(0), Shard(1)}}};
}

const bool embedding_samples_registered = add_op_samples({
    lookup("embedding", [](In x) { return at::embedding(x[0], x[1]); }, /*two_d=*/true),
    lookup("embedding_padding_idx", [](In x) { return at::embedding(x[0], x[1], /*padding_idx=*/2); }),
    lookup("embedding_scale_grad_by_freq", [](In x) { return at::embedding(x[0], x[1], -1, /*scale_grad_by_freq=*/true); }),
    gradient("embedding_dense_backward", -1, false),
    gradient("embedding_dense_backward_padding_idx_scaled", 2, true),
});

}  // namespace
}  // namespace dtensor::testing
