// Samples for the pooling family: [5, 3, *spatial] inputs (batch 5 uneven over 4 ranks, 3 channels),
// pools, unpools, adaptive and fractional pools, every interpolation mode of upsample and grid
// sampling, forward and (through autograd, or called directly) backward.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

// Distinct values, so that max pools have one right index whatever the shard.
at::Tensor distinct(size_t, const Shape& shape) {
  const int64_t n = numel(shape);
  return at::arange(n, at::kDouble).mul(7).remainder(n).div(n).view(shape);
}

// Grid coordinates in [-1, 1] (the last dim: x, y[, z]).
at::Tensor grid_or_values(size_t i, const Shape& shape) {
  const at::Tensor t = test_tensor(shape, at::kDouble, 500 + i);
  return i == 1 ? t / 9 : t;
}

// Random samples for fractional max pools, in [0, 1).
at::Tensor input_then_samples(size_t i, const Shape& shape) {
  return i == 0 ? distinct(i, shape) : (test_tensor(shape, at::kDouble, 600).abs() / 9).clamp(0, 0.99);
}

// The batch and channel dims of a [5, 3, ...] input, alone or with a second input alike.
const std::vector<Placement> kPlanes = {Replicate(), Shard(0), Shard(1)};

const bool pooling_samples_registered = add_op_samples({
    {.name = "avg_pool2d", .shapes = {{5, 3, 6, 6}}, .run = [](In x) { return outputs(at::avg_pool2d(x[0], {2, 2}, {2, 1}, {1, 0})); },
     .two_d = true},
    {.name = "avg_pool3d", .shapes = {{5, 3, 4, 4, 4}}, .run = [](In x) { return outputs(at::avg_pool3d(x[0], {2, 2, 2})); }},
    {.name = "adaptive_avg_pool2d", .shapes = {{5, 3, 7, 5}}, .run = [](In x) { return outputs(at::adaptive_avg_pool2d(x[0], {3, 2})); }},
    {.name = "adaptive_avg_pool3d", .shapes = {{5, 3, 5, 4, 3}}, .run = [](In x) { return outputs(at::adaptive_avg_pool3d(x[0], {2, 2, 2})); }},
    {.name = "max_pool2d", .shapes = {{5, 3, 6, 6}},
     .run = [](In x) {
       auto [values, indices] = at::max_pool2d_with_indices(x[0], {2, 2}, {2, 2}, {1, 1});
       return outputs(values, indices);
     },
     .make_input = distinct, .two_d = true},
    {.name = "max_pool3d", .shapes = {{5, 3, 4, 4, 4}},
     .run = [](In x) {
       auto [values, indices] = at::max_pool3d_with_indices(x[0], {2, 2, 2});
       return outputs(values, indices);
     },
     .make_input = distinct},
    {.name = "adaptive_max_pool2d", .shapes = {{5, 3, 7, 5}},
     .run = [](In x) {
       auto [values, indices] = at::adaptive_max_pool2d(x[0], {3, 2});
       return outputs(values, indices);
     },
     .make_input = distinct},
    {.name = "adaptive_max_pool3d", .shapes = {{5, 3, 5, 4, 3}},
     .run = [](In x) {
       auto [values, indices] = at::adaptive_max_pool3d(x[0], {2, 2, 2});
       return outputs(values, indices);
     },
     .make_input = distinct},
    {.name = "fractional_max_pool2d", .shapes = {{5, 3, 7, 7}, {5, 3, 2}},
     .run = [](In x) {
       auto [values, indices] = at::fractional_max_pool2d(x[0], {2, 2}, {3, 3}, x[1]);
       return outputs(values, indices);
     },
     .make_input = input_then_samples, .placements = {kPlanes, kPlanes}, .differentiable = {true, false}},
    {.name = "fractional_max_pool3d", .shapes = {{5, 3, 5, 5, 5}, {5, 3, 3}},
     .run = [](In x) {
       auto [values, indices] = at::fractional_max_pool3d(x[0], {2, 2, 2}, {2, 2, 2}, x[1]);
       return outputs(values, indices);
     },
     .make_input = input_then_samples, .placements = {kPlanes, kPlanes}, .differentiable = {true, false}},
    {.name = "max_unpool2d", .shapes = {{5, 3, 6, 6}},
     .run = [](In x) {
       auto [values, indices] = at::max_pool2d_with_indices(x[0], {2, 2});
       return outputs(at::max_unpool2d(values, indices, {6, 6}));
     },
     .make_input = distinct},
    {.name = "max_unpool3d", .shapes = {{5, 3, 4, 4, 4}},
     .run = [](In x) {
       auto [values, indices] = at::max_pool3d_with_indices(x[0], {2, 2, 2});
       return outputs(at::max_unpool3d(values, indices, {4, 4, 4}, {2, 2, 2}, {0, 0, 0}));
     },
     .make_input = distinct},
    {.name = "upsample_nearest1d", .shapes = {{5, 3, 4}}, .run = [](In x) { return outputs(at::upsample_nearest1d(x[0], {7})); }},
    {.name = "upsample_nearest2d", .shapes = {{5, 3, 4, 3}}, .run = [](In x) { return outputs(at::upsample_nearest2d(x[0], {7, 5})); },
     .two_d = true},
    {.name = "upsample_nearest3d", .shapes = {{5, 3, 2, 3, 2}}, .run = [](In x) { return outputs(at::upsample_nearest3d(x[0], {3, 5, 4})); }},
    {.name = "upsample_nearest_exact1d", .shapes = {{5, 3, 4}}, .run = [](In x) { return outputs(at::_upsample_nearest_exact1d(x[0], {7})); }},
    {.name = "upsample_nearest_exact2d", .shapes = {{5, 3, 4, 3}}, .run = [](In x) { return outputs(at::_upsample_nearest_exact2d(x[0], {7, 5})); }},
    {.name = "upsample_nearest_exact3d", .shapes = {{5, 3, 2, 3, 2}},
     .run = [](In x) { return outputs(at::_upsample_nearest_exact3d(x[0], {3, 5, 4})); }},
    {.name = "upsample_linear1d", .shapes = {{5, 3, 4}}, .run = [](In x) { return outputs(at::upsample_linear1d(x[0], {7}, true)); }},
    {.name = "upsample_bilinear2d", .shapes = {{5, 3, 4, 3}}, .run = [](In x) { return outputs(at::upsample_bilinear2d(x[0], {7, 5}, false)); },
     .two_d = true},
    {.name = "upsample_bicubic2d", .shapes = {{5, 3, 4, 3}}, .run = [](In x) { return outputs(at::upsample_bicubic2d(x[0], {7, 5}, true)); }},
    {.name = "upsample_trilinear3d", .shapes = {{5, 3, 2, 3, 2}},
     .run = [](In x) { return outputs(at::upsample_trilinear3d(x[0], {3, 5, 4}, false)); }},
    {.name = "upsample_bilinear2d_aa", .shapes = {{5, 3, 8, 6}}, .run = [](In x) { return outputs(at::_upsample_bilinear2d_aa(x[0], {3, 4}, false)); }},
    {.name = "upsample_bicubic2d_aa", .shapes = {{5, 3, 8, 6}}, .run = [](In x) { return outputs(at::_upsample_bicubic2d_aa(x[0], {3, 4}, false)); }},
    {.name = "upsample_lanczos2d_aa", .shapes = {{5, 3, 8, 6}}, .run = [](In x) { return outputs(at::_upsample_lanczos2d_aa(x[0], {3, 4}, false)); }},
    {.name = "grid_sampler_2d", .shapes = {{5, 3, 4, 4}, {5, 3, 2, 2}},
     .run = [](In x) { return outputs(at::grid_sampler_2d(x[0], x[1], 0, 0, false)); },
     .make_input = grid_or_values, .placements = {kPlanes, {Replicate(), Shard(0)}}},
    {.name = "grid_sampler_3d", .shapes = {{5, 3, 3, 3, 3}, {5, 2, 2, 2, 3}},
     .run = [](In x) { return outputs(at::grid_sampler_3d(x[0], x[1], 0, 1, true)); },
     .make_input = grid_or_values, .placements = {kPlanes, {Replicate(), Shard(0)}}},
});

}  // namespace
}  // namespace dtensor::testing
