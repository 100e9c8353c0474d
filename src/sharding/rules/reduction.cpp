// Reductions. Reducing over a sharded dim leaves each rank a partial result: Partial(sum) for sums.
// Dims that are not reduced keep their shards (renumbered when the reduced dims are dropped).

#include <set>

#include "../registry.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

// The reduced dims of a call: the `dim` argument (all dims when absent or empty) and `keepdim`.
struct Reduced {
  std::set<int64_t> dims;
  bool keepdim = false;
};

Reduced reduced_dims(const OpSchema& s) {
  const int64_t ndim = s.input_ndim(0);
  Reduced r;
  const auto& args = s.schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == "dim" && !s.args[i].isNone()) {
      if (s.args[i].isInt()) r.dims.insert(wrap_dim(s.args[i].toInt(), ndim));
      else
        for (int64_t d : s.args[i].toIntVector()) r.dims.insert(wrap_dim(d, ndim));
    }
    if (args[i].name() == "keepdim") r.keepdim = s.args[i].toBool();
  }
  if (r.dims.empty())
    for (int64_t d = 0; d < ndim; ++d) r.dims.insert(d);
  return r;
}

// Where input dim d ends up in the output, or -1 when it is reduced away.
int64_t output_dim(const Reduced& r, int64_t d) {
  if (r.dims.count(d)) return r.keepdim ? d : -1;
  int64_t before = 0;
  for (int64_t x : r.dims) before += x < d;
  return r.keepdim ? d : d - before;
}

std::vector<DimStrategy> sum(const OpSchema& s) {
  const Reduced r = reduced_dims(s);
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d) {
    if (r.dims.count(d)) out.push_back({{Partial()}, {Shard(d)}});
    else out.push_back({{Shard(output_dim(r, d))}, {Shard(d)}});
  }
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{Partial(op)}, {Partial(op)}});
  return out;
}

const bool registered = [] {
  detail::register_family({"aten::sum"}, {.dim = sum, .family = "reduction"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
