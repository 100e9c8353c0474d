// Pooling, unpooling, upsampling and grid sampling on [N, C, *spatial] tensors (or [C, *spatial]
// unbatched): each output element is computed from one (sample, channel) plane, so the leading dims
// (batch and channel) shard alike in every tensor and the spatial dims stay whole, as PyTorch's DTensor
// does. The interpolations and average pools are linear in their input, so a Partial(sum | avg) input
// gives a Partial output (their backward ops are linear in the incoming gradient). The max pools are
// not (their indices are positions, not values). Backward ops that take the input's size as an
// argument (upsample's input_size) get this rank's.

#include <ATen/ATen.h>

#include <string>

#include "../registry.h"
#include "dtensor/layout.h"
#include "form_helpers.h"
#include "optional_tensors.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

// The number of spatial dims the op works on, from its name (upsample_bilinear2d: 2).
int64_t spatial_dims(const OpSchema& s) {
  const std::string& name = s.schema.name();
  for (int64_t k : {1, 2, 3})
    if (name.find(std::to_string(k) + "d") != std::string::npos) return k;
  throw DTensorError(name + ": cannot tell how many spatial dims it pools over");
}

// Every tensor input sharded on leading dim d: those of the operand's rank, and fractional max
// pool's random_samples ([N, C, 2], for batched inputs). Nullopt when an input has another rank.
std::optional<Placements> leading_dim_inputs(const OpSchema& s, int64_t d, int64_t ndim, int64_t spatial) {
  Placements out;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const int64_t rank = s.input_ndim(i);
    const bool samples = s.schema.arguments()[s.inputs[i].arg].name() == "random_samples" && ndim == spatial + 2 && rank == 3;
    if (rank != ndim && !samples) return std::nullopt;
    out.push_back(Shard(d));
  }
  return out;
}

std::vector<DimStrategy> planes(const OpSchema& s, bool linear) {
  const int64_t spatial = spatial_dims(s);
  const int64_t ndim = s.input_ndim(0);
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < ndim - spatial; ++d)
    if (auto inputs = leading_dim_inputs(s, d, ndim, spatial)) out.push_back({Placements(s.outputs.size(), Shard(d)), std::move(*inputs)});
  if (linear && s.inputs.size() == 1)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{Partial(op)}, {Partial(op)}});
  return out;
}

// upsample_*_backward(grad_output, output_size, input_size, ...): input_size names the gradient's
// global shape; each rank computes its own part.
LocalArgs local_input_size(const OpSchema& s, const PlacementStrategy& chosen) {
  const auto index = s.schema.argumentIndexWithName("input_size");
  if (!index) return {};
  return {{*index, c10::IValue(local_output_shape(s, chosen))}};
}

// grid_sampler_2d / 3d(input [N, C, *in], grid [N, *out, k], ...) -> [N, C, *out]: batch shards the
// input and the grid alike; channels shard the input alone, the grid Replicate.
std::vector<DimStrategy> grid_sampler(const OpSchema& s) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  out.push_back({{Shard(0)}, {Shard(0), Shard(0)}});
  out.push_back({{Shard(1)}, {Shard(1), Replicate()}});
  return out;
}

// grid_sampler_*_backward(grad_output, input, grid, ..., output_mask) -> (grad_input?, grad_grid?):
// batch shards all alike; channels shard grad_output and input, and the grid's gradient, a sum over
// channels, comes out Partial(sum).
std::vector<DimStrategy> grid_sampler_backward(const OpSchema& s) {
  const Placements by_batch(s.outputs.size(), Shard(0));
  const Placements by_channel = asked(s, {Shard(1), Partial()});
  return {all_replicate(s), {by_batch, {Shard(0), Shard(0), Shard(0)}}, {by_channel, {Shard(1), Shard(1), Replicate()}}};
}

// The kernels reject inputs without elements (3 channels over 4 ranks leave one rank none): there,
// every output is empty too.
const FormedKernel empty_planes = zero_outputs_when_empty(0);


detail::OpRule rule(bool linear, LocalArgsRule local_args = {}) {
  return {.dim = [linear](const OpSchema& s) { return planes(s, linear); },
          .local_args = std::move(local_args),
          .local_kernel = empty_planes.kernel,
          .graph_form = empty_planes.graph_form,
          .family = "pooling"};
}

const bool pooling_rules_registered = [] {
  using detail::register_family;
  register_family({"aten::avg_pool2d", "aten::avg_pool3d", "aten::avg_pool2d_backward", "aten::avg_pool3d_backward",
                   "aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool3d", "aten::_adaptive_avg_pool2d_backward",
                   "aten::_adaptive_avg_pool3d_backward"},
                  rule(/*linear=*/true));
  register_family({"aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices", "aten::max_pool2d_with_indices_backward",
                   "aten::max_pool3d_with_indices_backward", "aten::adaptive_max_pool2d", "aten::adaptive_max_pool3d",
                   "aten::adaptive_max_pool2d_backward", "aten::adaptive_max_pool3d_backward", "aten::max_unpool2d",
                   "aten::max_unpool3d", "aten::fractional_max_pool2d", "aten::fractional_max_pool3d",
                   "aten::fractional_max_pool2d_backward"},
                  rule(/*linear=*/false));
  detail::OpRule fractional_3d_backward = rule(/*linear=*/false);
  // No Meta kernel, and on stand-in zeros it rejects their indices: its gradient is shaped like its input.
  fractional_3d_backward.output_metas = like_self;
  register_family({"aten::fractional_max_pool3d_backward"}, fractional_3d_backward);
  register_family({"aten::upsample_nearest1d", "aten::upsample_nearest2d", "aten::upsample_nearest3d",
                   "aten::_upsample_nearest_exact1d", "aten::_upsample_nearest_exact2d", "aten::_upsample_nearest_exact3d",
                   "aten::upsample_linear1d", "aten::upsample_bilinear2d", "aten::upsample_bicubic2d",
                   "aten::upsample_trilinear3d", "aten::_upsample_bilinear2d_aa", "aten::_upsample_bicubic2d_aa",
                   "aten::_upsample_lanczos2d_aa", "aten::upsample_nearest1d_backward", "aten::upsample_nearest2d_backward",
                   "aten::upsample_nearest3d_backward", "aten::_upsample_nearest_exact1d_backward",
                   "aten::_upsample_nearest_exact2d_backward", "aten::_upsample_nearest_exact3d_backward",
                   "aten::upsample_linear1d_backward", "aten::upsample_bilinear2d_backward", "aten::upsample_bicubic2d_backward",
                   "aten::upsample_trilinear3d_backward", "aten::_upsample_bilinear2d_aa_backward",
                   "aten::_upsample_bicubic2d_aa_backward", "aten::_upsample_lanczos2d_aa_backward"},
                  rule(/*linear=*/true, local_input_size));
  register_family({"aten::grid_sampler_2d", "aten::grid_sampler_3d"},
                  {.dim = grid_sampler, .local_kernel = empty_planes.kernel, .graph_form = empty_planes.graph_form, .family = "pooling"});
  register_family({"aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward"},
                  {.dim = grid_sampler_backward, .local_kernel = empty_planes.kernel, .graph_form = empty_planes.graph_form,
                   .family = "pooling"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
