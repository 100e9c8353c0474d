// View and shape ops. A view keeps every placement, with Shard dims following the dims they came from;
// views are linear, so Partial stays Partial.

#include "../registry.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

// Output dim of each input dim for ops that only reorder dims.
std::vector<int64_t> dim_order(const OpSchema& s) {
  const int64_t ndim = s.input_ndim(0);
  std::vector<int64_t> out_of(ndim);
  for (int64_t d = 0; d < ndim; ++d) out_of[d] = d;
  const std::string name = s.schema.name();
  if (name == "aten::t" || name == "aten::transpose") {
    if (ndim < 2) return out_of;
    const int64_t a = name == "aten::t" ? 0 : wrap_dim(s.args[1].toInt(), ndim);
    const int64_t b = name == "aten::t" ? 1 : wrap_dim(s.args[2].toInt(), ndim);
    std::swap(out_of[a], out_of[b]);
  } else if (name == "aten::permute") {
    const auto dims = s.args[1].toIntVector();
    for (int64_t o = 0; o < ndim; ++o) out_of[wrap_dim(dims[o], ndim)] = o;
  }
  return out_of;
}

std::vector<DimStrategy> reorder(const OpSchema& s) {
  const auto out_of = dim_order(s);
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < static_cast<int64_t>(out_of.size()); ++d) out.push_back({{Shard(out_of[d])}, {Shard(d)}});
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) out.push_back({{Partial(op)}, {Partial(op)}});
  return out;
}

// expand: input dims align with the output's trailing dims; a dim that is not broadcast keeps its
// shard, a broadcast one (size 1) cannot be sharded.
std::vector<DimStrategy> expand(const OpSchema& s) {
  const Shape& in = s.input(0).meta.shape;
  const Shape& out = s.outputs[0].shape;
  const int64_t offset = static_cast<int64_t>(out.size() - in.size());
  std::vector<DimStrategy> strategies = {all_replicate(s)};
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d)
    if (in[d] == out[d + offset]) strategies.push_back({{Shard(d + offset)}, {Shard(d)}});
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) strategies.push_back({{Partial(op)}, {Partial(op)}});
  return strategies;
}

// The `size` argument (index 1) is global; the local call needs this rank's output shape.
LocalArgs local_size_arg(const OpSchema& s, const PlacementStrategy& chosen) {
  return {{1, c10::IValue(local_output_shape(s, chosen))}};
}

const bool registered = [] {
  detail::register_family({"aten::expand"}, {.dim = expand, .local_args = local_size_arg, .family = "view"});
  detail::register_family({"aten::t", "aten::transpose", "aten::permute", "aten::detach", "aten::alias"},
                          {.dim = reorder, .family = "view"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
