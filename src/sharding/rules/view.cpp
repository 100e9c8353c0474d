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

const bool registered = [] {
  detail::register_family({"aten::t", "aten::transpose", "aten::permute", "aten::detach", "aten::alias"},
                          {reorder, {}});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
