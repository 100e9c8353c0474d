// Samples for group normalisation (native_group_norm and its backward) on a batch of 5 (uneven over 4
// ranks). 6 channels in 3 groups split over 4 ranks as 2, 2, 2, 0 channels: whole groups, so channel
// sharding runs without communication (on the 2x2 mesh, 3 channels per rank would cut a group, and the
// channels are gathered instead); in 2 groups of 3 they never align.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

// native_group_norm_backward called directly: grad_out is also tried Partial (the gradients are
// linear in it). Inputs: grad_out, input, mean and a positive rstd per (sample, group), weight.
OpSample group_norm_backward_sample() {
  const std::vector<Placement> activations{Replicate(), Shard(0), Shard(1)};
  return {.name = "native_group_norm_backward",
          .shapes = {{5, 6, 4}, {5, 6, 4}, {5, 3}, {5, 3}, {6}},
          .run = [](In x) {
            const auto [gi, gw, gb] =
                at::native_group_norm_backward(x[0], x[1], x[2], x[3], x[4], 5, 6, 4, 3, {true, true, true});
            return outputs(gi, gw, gb);
          },
          .make_input = [](size_t i, const Shape& shape) {
            const at::Tensor t = test_tensor(shape, at::kDouble, 870 + i);
            return i == 3 ? t.abs() / 8 + 1 : t;
          },
          .placements = {{Replicate(), Shard(0), Shard(1), Partial()}, activations, activations, activations,
                         {Replicate(), Shard(0)}},
          .backward = false,
          .no_backward_reason = "LibTorch has no derivative for native_group_norm_backward",
          .partial_inputs = false};
}

const bool group_norm_samples_registered = add_op_samples({
    group_norm_backward_sample(),
    {.name = "group_norm",
     .shapes = {{5, 6, 4}, {6}, {6}},
     .run = [](In x) { return outputs(at::group_norm(x[0], 3, x[1], x[2])); },
     .two_d = true},
    {.name = "group_norm_groups_across_shards",
     .shapes = {{5, 6, 4}, {6}, {6}},
     .run = [](In x) { return outputs(at::group_norm(x[0], 2, x[1], x[2], 1e-3)); }},
    {.name = "group_norm_no_affine_2d",
     .shapes = {{5, 4, 2, 3}},
     .run = [](In x) { return outputs(at::group_norm(x[0], 2)); }},
    // The input's gradient not asked for.
    {.name = "group_norm_input_without_grad",
     .shapes = {{5, 6, 4}, {6}, {6}},
     .run = [](In x) { return outputs(at::group_norm(x[0].detach(), 3, x[1], x[2])); }},
});

}  // namespace
}  // namespace dtensor::testing
