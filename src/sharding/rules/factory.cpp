// Ops that create tensors from another tensor's shape. *_like ops keep the input's layout (a
// Partial input gives a Replicate output: ones_like of a Partial(sum) would otherwise add up to n).
// new_* ops take a global size: of the input's own shape, the new tensor takes the input's layout too
// (as PyTorch's new-factory strategy does: a sharded tensor's new_zeros(its shape) stays sharded, where
// a Replicate one would hold the whole tensor on every rank); any other size makes a Replicate tensor.
// AccumulateGrad copies a gradient into grad.new_empty_strided(param sizes, param strides), so strided
// and head-tail gradients keep their layout. Neither reads the input's values, so the input never
// moves (a StridedShard one included).

#include "../registry.h"
#include "dtensor/layout.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

OpStrategy like(const OpSchema& s) {
  return {PlacementStrategy{{partial_as_replicate(s.input(0).placements)}, {s.input(0).placements}, {}}};
}

OpStrategy fresh(const OpSchema& s) {
  if (s.outputs[0].shape == s.input(0).meta.shape) return like(s);
  return {PlacementStrategy{{Placements(s.mesh->ndim(), Replicate())}, {s.input(0).placements}, {}}};
}

// The local call's size (index 1): this rank's.
LocalArgs local_size(const OpSchema& s, const PlacementStrategy& chosen) { return {{1, c10::IValue(local_output_shape(s, chosen))}}; }

// new_empty_strided's too, with dense strides for it in the dim order of the requested global strides
// (global_stride_like, used the other way round: it lays out its first shape in the second's order).
LocalArgs local_size_and_stride(const OpSchema& s, const PlacementStrategy& chosen) {
  const Shape local = local_output_shape(s, chosen);
  const Shape stride = global_stride_like(local, s.outputs[0].shape, s.outputs[0].stride);
  return {{1, c10::IValue(local)}, {2, c10::IValue(stride)}};
}

const bool factory_rules_registered = [] {
  using enum detail::StridedShards;
  detail::register_family({"aten::empty_like", "aten::zeros_like", "aten::ones_like", "aten::full_like"},
                          {.mesh = like, .family = "factory", .strided_shards = Own});
  detail::register_family({"aten::new_empty", "aten::new_zeros", "aten::new_ones", "aten::new_full"},
                          {.mesh = fresh, .local_args = local_size, .family = "factory", .strided_shards = Own});
  detail::register_family({"aten::new_empty_strided"},
                          {.mesh = fresh, .local_args = local_size_and_stride, .family = "factory", .strided_shards = Own});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
