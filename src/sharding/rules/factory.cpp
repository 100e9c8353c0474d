// Ops that create tensors from another tensor's shape. *_like ops keep the input's layout (a
// Partial input gives a Replicate output: ones_like of a Partial(sum) would otherwise add up to n);
// new_* ops take a global size, so they give a Replicate tensor of that size. Neither reads the
// input's values, so the input never moves (a StridedShard one included).

#include "../registry.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

OpStrategy like(const OpSchema& s) {
  return {PlacementStrategy{{partial_as_replicate(s.input(0).placements)}, {s.input(0).placements}, {}}};
}

OpStrategy fresh(const OpSchema& s) {
  return {PlacementStrategy{{Placements(s.mesh->ndim(), Replicate())}, {s.input(0).placements}, {}}};
}

const bool factory_rules_registered = [] {
  using enum detail::StridedShards;
  detail::register_family({"aten::empty_like", "aten::zeros_like", "aten::ones_like", "aten::full_like"},
                          {.mesh = like, .family = "factory", .strided_shards = Own});
  detail::register_family({"aten::new_empty", "aten::new_zeros", "aten::new_ones", "aten::new_full"},
                          {.mesh = fresh, .family = "factory", .strided_shards = Own});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
