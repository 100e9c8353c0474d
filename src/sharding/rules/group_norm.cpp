// Group normalisation: native_group_norm (what GroupNorm and functional::group_norm reach) and
// native_group_norm_backward. input [N, C, *spatial], weight and bias [C], the saved mean and rstd
// [N, G]; each sample's channels fall into G groups of C / G, normalised over (group, spatial).
//
// - batch: input and statistics Shard(0), weight and bias Replicate: samples are independent, no
//   communication; the gradients of weight and bias are per-rank sums (Partial);
// - channels: only when every way the mesh may split the C channels cuts whole groups (and cuts the
//   G statistics alike); then input Shard(1), weight and bias Shard(0), statistics Shard(1). A
//   split inside a group would need the group's statistics from two ranks: such inputs are
//   redistributed instead.
// The op's N, C and group arguments are global counts; the local call gets this rank's. The
// backward op is linear in grad_output, so a Partial one stays Partial.

#include <ATen/ATen.h>

#include "../registry.h"
#include "form_helpers.h"
#include "optional_tensors.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

int64_t channels_per_group(const OpSchema& s) { return argument(s, "C").toInt() / argument(s, "group").toInt(); }

// Whether sharding the channels over any set of mesh dims (nested in mesh-dim order) gives every rank
// whole groups, and the same groups as sharding the G statistics that way.
bool channel_shards_follow_groups(const OpSchema& s) {
  const int64_t channels = argument(s, "C").toInt(), groups = argument(s, "group").toInt();
  const int64_t per_group = channels / groups;
  const Shape& mesh_shape = s.mesh->shape();
  const auto ndim = static_cast<int64_t>(mesh_shape.size());
  for (int64_t subset = 1; subset < (int64_t{1} << ndim); ++subset) {
    Placements placements(ndim, Replicate());
    for (int64_t m = 0; m < ndim; ++m)
      if ((subset >> m) & 1) placements[m] = Shard(0);
    for (int64_t rank = 0; rank < numel(mesh_shape); ++rank) {
      Shape coordinate(ndim);
      for (int64_t m = ndim - 1, rest = rank; m >= 0; rest /= mesh_shape[m], --m) coordinate[m] = rest % mesh_shape[m];
      const LocalLayout c = local_layout({channels}, mesh_shape, coordinate, placements);
      const LocalLayout g = local_layout({groups}, mesh_shape, coordinate, placements);
      if (c.shape[0] != g.shape[0] * per_group || c.offset[0] != g.offset[0] * per_group) return false;
    }
  }
  return true;
}

// ---- native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean, rstd)

std::vector<DimStrategy> group_norm(const OpSchema& s) {
  auto strategy = [&](Placement input, Placement per_channel) {
    return DimStrategy{{input, input, input}, by_argument(s, [&](size_t arg) { return arg == 0 ? input : per_channel; })};
  };
  std::vector<DimStrategy> out = {strategy(Replicate(), Replicate()), strategy(Shard(0), Replicate())};
  if (channel_shards_follow_groups(s)) out.push_back(strategy(Shard(1), Shard(0)));
  return out;
}

// ---- native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW, group, output_mask)
// -> (grad_input?, grad_weight?, grad_bias?)

std::vector<DimStrategy> group_norm_backward(const OpSchema& s) {
  auto strategy = [&](Placements grads, Placement activations, Placement weight) {
    return DimStrategy{asked(s, grads), by_argument(s, [&](size_t arg) { return arg == 4 ? weight : activations; })};
  };
  const Placement R = Replicate();
  std::vector<DimStrategy> out = {strategy({R, R, R}, R, R), strategy({Shard(0), Partial(), Partial()}, Shard(0), R)};
  if (channel_shards_follow_groups(s)) out.push_back(strategy({Shard(1), Shard(0), Shard(0)}, Shard(1), Shard(0)));
  for (ReduceOp op : linear_reduce_ops(s)) {
    const Placement p = Partial(op);
    out.push_back({asked(s, {p, p, p}), by_argument(s, [&](size_t arg) { return arg == 0 ? p : R; })});
  }
  return out;
}

// N, C and group for this rank's part of the input (argument `input`).
LocalArgsRule local_counts(size_t input) {
  return [input](const OpSchema& s, const PlacementStrategy& chosen) -> LocalArgs {
    const Shape local = local_part(s, s.input(input).meta.shape, chosen.inputs[input]).shape;
    auto index = [&](const char* name) { return *s.schema.argumentIndexWithName(name); };
    return {{index("N"), c10::IValue(local[0])},
            {index("C"), c10::IValue(local[1])},
            {index("group"), c10::IValue(local[1] / channels_per_group(s))}};
  };
}

const bool group_norm_rules_registered = [] {
  using detail::register_overloads;
  // The CPU kernels divide by the group count, which is zero on a rank without channels.
  const FormedKernel forward_when_empty = zero_outputs_when_empty(0), backward_when_empty = zero_outputs_when_empty(1);
  register_overloads({"aten::native_group_norm"}, {.dim = group_norm,
                                                   .local_args = local_counts(0),
                                                   .local_kernel = forward_when_empty.kernel,
                                                   .graph_form = forward_when_empty.graph_form,
                                                   .family = "norm"});
  register_overloads({"aten::native_group_norm_backward"}, {.dim = group_norm_backward,
                                                            .local_args = local_counts(1),
                                                            .local_kernel = backward_when_empty.kernel,
                                                            .graph_form = backward_when_empty.graph_form,
                                                            .family = "norm"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
