// Samples for embedding_bag: a table of 7 rows (2, 2, 2, 1 over 4 ranks) and 3 columns, 8 indices
// that repeat rows and include every row, in 4 bags (the second empty) — all four outputs (the bags'
// offset2bag, bag_size and max_indices too) are compared. Modes sum, mean and max; per-sample weights;
// padding_idx; include_last_offset; scale_grad_by_freq; and a table without gradient
// (_embedding_bag_forward_only). Their gradients run _embedding_bag_backward and
// _embedding_bag_per_sample_weights_backward; the first is also called directly, with Partial gradients.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

constexpr int64_t kSum = 0, kMean = 1, kMax = 2;

// Inputs: table [7, 3], indices [8], offsets [4] (or [5] ending at 8), per-sample weights [8].
at::Tensor bag_input(size_t i, const Shape& shape) {
  if (i == 1) return at::tensor({1, 2, 4, 5, 6, 0, 3, 6}, at::kLong);
  if (i == 2) return shape[0] == 4 ? at::tensor({0, 2, 2, 5}, at::kLong) : at::tensor({0, 2, 2, 5, 8}, at::kLong);
  return test_tensor(shape, at::kDouble, 900 + i);
}

struct Bags {
  int64_t mode = kSum;
  bool per_sample_weights = false;
  int64_t padding_idx = -1;  // none
  bool include_last_offset = false;
  bool scale_grad_by_freq = false;
  bool table_gradient = true;
  bool two_d = false;
};

OpSample bags(std::string name, Bags b) {
  std::vector<Shape> shapes = {{7, 3}, {8}, {b.include_last_offset ? 5 : 4}};
  std::vector<std::vector<Placement>> placements = {
      {Replicate(), Shard(0), Shard(1), Partial()}, {Replicate(), Shard(0)}, {Replicate()}};
  if (b.per_sample_weights) {
    shapes.push_back({8});
    placements.push_back({Replicate(), Shard(0), Partial()});
  }
  return {.name = std::move(name),
          .shapes = shapes,
          .run = [b](In x) {
            const at::Tensor table = b.table_gradient ? x[0] : x[0].detach();
            const auto [out, offset2bag, bag_size, max_indices] =
                at::embedding_bag(table, x[1], x[2], b.scale_grad_by_freq, b.mode, /*sparse=*/false,
                                  b.per_sample_weights ? x[3] : at::Tensor(), b.include_last_offset,
                                  b.padding_idx >= 0 ? std::optional<int64_t>(b.padding_idx) : std::nullopt);
            return outputs(out, offset2bag, bag_size, max_indices);
          },
          .make_input = bag_input,
          .placements = placements,
          .two_d = b.two_d};
}

// _embedding_bag_backward called directly (mean mode, padding_idx 6): the gradient [4, 3] is also
// tried Partial (the table's gradient is linear in it); the bag outputs come from the forward op.
OpSample embedding_bag_backward_sample() {
  return {.name = "embedding_bag_backward_mean",
          .shapes = {{4, 3}, {8}, {4}, {8}, {4}, {4}},
          .run = [](In x) {
            return outputs(at::_embedding_bag_backward(x[0], x[1], x[2], x[3], x[4], x[5], 7, /*scale_grad_by_freq=*/false,
                                                       kMean, /*sparse=*/false, {}, /*padding_idx=*/6));
          },
          .make_input = [](size_t i, const Shape& shape) {
            if (i == 0) return test_tensor(shape, at::kDouble, 950);
            if (i <= 2) return bag_input(i, shape);
            const auto bags = at::_embedding_bag(at::zeros({7, 3}, at::kDouble), bag_input(1, {8}), bag_input(2, {4}),
                                                 false, kMean, false, {}, false, 6);
            return i == 3 ? std::get<1>(bags) : i == 4 ? std::get<2>(bags) : std::get<3>(bags);
          },
          .placements = {{Replicate(), Shard(0), Shard(1), Partial()}, {Replicate()}, {Replicate()}, {Replicate()},
                         {Replicate()}, {Replicate()}},
          .backward = false,
          .no_backward_reason = "LibTorch has no derivative for _embedding_bag_backward",
          .partial_inputs = false};
}

const bool embedding_bag_samples_registered = add_op_samples({
    embedding_bag_backward_sample(),
    bags("embedding_bag_sum", {.two_d = true}),
    bags("embedding_bag_mean_padding_idx", {.mode = kMean, .padding_idx = 6, .two_d = true}),
    bags("embedding_bag_max", {.mode = kMax}),
    bags("embedding_bag_per_sample_weights", {.per_sample_weights = true, .padding_idx = 2}),
    bags("embedding_bag_last_offset_scaled", {.mode = kMean, .include_last_offset = true, .scale_grad_by_freq = true}),
    bags("embedding_bag_forward_only", {.mode = kMean, .table_gradient = false}),
});

}  // namespace
}  // namespace dtensor::testing
