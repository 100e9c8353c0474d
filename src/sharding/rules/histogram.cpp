// Binning values. bucketize(self, boundaries) finds each element's bin on its own: self shards any
// way, the boundaries are Replicate, the indices come out placed as self. histc(self, bins, min, max)
// counts elements per bin: counts of the shards add up, so any shard of self gives a Partial(sum)
// histogram. With min == max the range is the data's own min and max, which the shards first agree on
// (the strategies cannot depend on min and max: the propagation cache keys numbers by kind).

#include <limits>

#include "../../mesh/collectives.h"
#include "../registry.h"
#include "optional_tensors.h"
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

// On a sharded input, a call with min == max counts over the global data range: the shards' minima
// and maxima meet in one all-reduce (max of -min and of max) over the mesh dims that shard the input.
LocalKernel histc_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  const std::vector<int64_t> dims = sharding_mesh_dims(chosen.inputs[0]);
  if (dims.empty()) return {};
  return [mesh = s.mesh, dims](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const at::Tensor& x = args[0].toTensor();
    double min = args[2].toScalar().toDouble(), max = args[3].toScalar().toDouble();
    if (min == max) {
      const double none = -std::numeric_limits<double>::infinity();  // an empty shard's
      at::Tensor range = at::tensor({x.numel() ? -x.min().item<double>() : none, x.numel() ? x.max().item<double>() : none}, at::kDouble);
      detail::all_reduce_over(*mesh, dims, range, ReduceOp::Max);
      if (range[1].item<double>() != none) {
        min = -range[0].item<double>();
        max = range[1].item<double>();
      }
    }
    torch::jit::push(stack, at::histc(x, args[1].toInt(), min, max));
  };
}

const bool histogram_rules_registered = [] {
  detail::register_overloads({"aten::bucketize.Tensor"}, {.dim = bucketize, .family = "histogram"});
  detail::register_family({"aten::histc"}, {.dim = histc, .local_kernel = histc_kernel, .family = "histogram"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
