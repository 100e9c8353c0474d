// Binning values. bucketize(self, boundaries) finds each element's bin on its own: self shards any
// way, the boundaries are Replicate, the indices come out placed as self. histc(self, bins, min, max)
// counts elements per bin: counts of the shards add up, so any shard of self gives a Partial(sum)
// histogram. With min == max the range is the data's own min and max, which the shards first agree on
// (the strategies cannot depend on min and max: the propagation cache keys numbers by kind).

#include <algorithm>

#include "../registry.h"
#include "form_helpers.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

std::vector<DimStrategy> bucketize(const OpSchema& s) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d) out.push_back({{Shard(d)}, {Shard(d), Replicate()}});
  return out;
}

std::vector<DimStrategy> histc(const OpSchema& s) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d) out.push_back({{Partial(ReduceOp::Sum)}, {Shard(d)}});
  return out;
}

// On a sharded input, a call with an explicit range (min != max) counts its shard's elements. One with
// min == max counts over the global data range, which only the whole tensor gives as the Scalars
// histc takes: the shards are put together on every rank (whole_tensor_form), each counts all of
// them, and the rank at coordinate 0 of the sharding mesh dims keeps its counts while the others
// give zeros, so the Partial(sum) adds up to the single-device histogram exactly.
GraphForm histc_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const std::vector<int64_t> dims = sharding_mesh_dims(chosen.inputs[0]);
  if (dims.empty()) return {};
  const Shape& global = s.input(0).meta.shape;
  const LocalLayout part = local_part(s, global, chosen.inputs[0]);
  const Shape coordinate = s.mesh->coordinate().value_or(Shape(s.mesh->ndim(), 0));
  const bool counts_here = std::all_of(dims.begin(), dims.end(), [&](int64_t m) { return coordinate[m] == 0; });
  return [global, part, dims, counts_here](GraphFormBuilder& b) {
    const c10::IValue bins = b.argument(1), min = b.argument(2), max = b.argument(3);
    if (min.toScalar().toDouble() != max.toScalar().toDouble())
      return std::vector<FormValue>{b.op("aten::histc", {b.input(0), bins, min, max}, "counts")};
    const FormValue whole = whole_tensor_form(b, b.input(0), part, global, dims);
    const FormValue counts = b.op("aten::histc", {whole, bins, min, max}, "counts");
    return std::vector<FormValue>{b.op("aten::mul.Scalar", {counts, counts_here ? 1.0 : 0.0}, "share")};
  };
}

const bool histogram_rules_registered = [] {
  detail::register_overloads({"aten::bucketize.Tensor"}, {.dim = bucketize, .family = "histogram"});
  const FormedKernel counts = written_as_form(histc_form);
  detail::register_family({"aten::histc"}, {.dim = histc, .local_kernel = counts.kernel, .graph_form = counts.graph_form, .family = "histogram"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
