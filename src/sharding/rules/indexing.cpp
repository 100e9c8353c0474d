// Indexing ops: index_select, index_add, index_fill, index_reduce, gather, scatter, index and index_put. A dim
// the op indexes into must be Replicate unless the index itself is sharded there, each rank then
// selecting (or adding) its share; dims the op leaves whole keep their shards in every operand alike.

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

#include "../registry.h"
#include "dtensor/errors.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

// ---- indexing ---------------------------------------------------------------------------------------

// index_select(self, dim, index): self may be sharded off `dim`; or the index is sharded, each rank
// selecting its share of the output along `dim`.
std::vector<DimStrategy> index_select(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.input_ndim(0));
  std::vector<DimStrategy> out = {all_replicate(s), {{Shard(dim)}, {Replicate(), Shard(0)}}};
  for (int64_t d = 0; d < s.input_ndim(0); ++d)
    if (d != dim) out.push_back({{Shard(d)}, {Shard(d), Replicate()}});
  for (auto op : kMovesValues) out.push_back({{Partial(op)}, {Partial(op), Replicate()}});
  return out;
}

// index_add(self, dim, index, source) and index_reduce(self, dim, index, source, reduce, ...): self and
// source (same dims) sharded alike off `dim`. The sum of Partial self and source is Partial; index_reduce
// has no Partial (prod, mean, amax and amin of sums are not the sums of theirs).
std::vector<DimStrategy> index_accumulate(const OpSchema& s, bool sums) {
  const int64_t dim = dim_arg(s, s.input_ndim(0));
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d)
    if (d != dim) out.push_back({{Shard(d)}, {Shard(d), Replicate(), Shard(d)}});
  if (sums)
    for (auto op : linear_reduce_ops(s, {0, 2})) out.push_back({{Partial(op)}, {Partial(op), Replicate(), Partial(op)}});
  return out;
}

// index_fill(self, dim, index, value): self sharded off `dim`, the index (and a 0-d value) Replicate.
// Filled positions hold the value on every rank, so Partial avg, max and min commute; sum does not
// (the ranks' values would add up).
std::vector<DimStrategy> index_fill(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.input_ndim(0));
  std::vector<DimStrategy> out = {all_replicate(s)};
  auto rest = [&](Placement self) {
    Placements p(s.inputs.size(), Replicate());
    p[0] = self;
    return p;
  };
  for (int64_t d = 0; d < s.input_ndim(0); ++d)
    if (d != dim) out.push_back({{Shard(d)}, rest(Shard(d))});
  for (auto op : {ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) out.push_back({{Partial(op)}, rest(Partial(op))});
  return out;
}

// Dims other than `dim` along which self, index and src (all of the same rank) have one size: only
// there do their chunks line up.
std::vector<int64_t> aligned_dims(const OpSchema& s, int64_t dim) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < s.input_ndim(0); ++d) {
    bool same = d != dim;
    for (size_t i = 1; same && i < s.inputs.size(); ++i)
      same = s.input_ndim(i) == s.input_ndim(0) && s.input(i).meta.shape[d] == s.input(0).meta.shape[d];
    if (same) out.push_back(d);
  }
  return out;
}

// gather(self, dim, index): out[..i..] = self[..index[..i..]..] along `dim`, self[..i..] elsewhere.
// Sharded alike where aligned; or the index sharded along `dim` over a whole self, each rank
// gathering its share of the output.
std::vector<DimStrategy> gather(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.input_ndim(0));
  std::vector<DimStrategy> out = {all_replicate(s), {{Shard(dim)}, {Replicate(), Shard(dim)}}};
  for (int64_t d : aligned_dims(s, dim)) out.push_back({{Shard(d)}, {Shard(d), Shard(d)}});
  for (auto op : kMovesValues) out.push_back({{Partial(op)}, {Partial(op), Replicate()}});
  return out;
}

// scatter / scatter_add(self, dim, index[, src]): sharded alike where aligned. Writing or adding a
// Partial src into a Partial self gives the Partial result; a written constant (scatter.value) would
// count once per rank, and the reduce overloads may multiply, so those need Replicate.
std::vector<DimStrategy> scatter(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.input_ndim(0));
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d : aligned_dims(s, dim)) out.push_back({{Shard(d)}, Placements(s.inputs.size(), Shard(d))});
  if (s.inputs.size() == 3 && s.schema.overload_name() != "reduce")
    for (auto op : linear_reduce_ops(s, {0, 2})) out.push_back({{Partial(op)}, {Partial(op), Replicate(), Partial(op)}});
  return out;
}

// Leading, non-None indices of index / index_put (`indices` at argument 1; the op's tensor inputs are
// self, the indices, then any others): how many dims they index (k) and the dims of the indexed
// result they make (index_ndim); nullopt where an index is None (x[:, i]).
struct LeadingIndices {
  int64_t k;
  int64_t index_ndim;
  size_t count;
};
std::optional<LeadingIndices> leading_indices(const OpSchema& s) {
  const auto indices = s.args[1].toListRef();
  for (const c10::IValue& index : indices)
    if (index.isNone()) return std::nullopt;
  LeadingIndices out{static_cast<int64_t>(indices.size()), 0, indices.size()};
  for (size_t i = 1; i <= out.count; ++i) out.index_ndim = std::max(out.index_ndim, s.input_ndim(i));
  return out;
}

// Whether every index has the same shape, so that their rows (dim 0) line up with each other and
// with the indexed result's dim 0.
bool index_rows_align(const OpSchema& s, const LeadingIndices& l) {
  if (l.index_ndim < 1) return false;
  for (size_t i = 1; i <= l.count; ++i)
    if (s.input(i).meta.shape != s.input(1).meta.shape) return false;
  return true;
}

// Placements of index's / index_put's tensor inputs: self, each index alike, then the values.
Placements indexing_inputs(const OpSchema& s, Placement self, Placement index, std::optional<Placement> values = std::nullopt) {
  Placements in(s.inputs.size(), index);
  in.front() = self;
  if (values) in.back() = *values;
  return in;
}

// index(self, indices) = self[indices] (advanced indexing by leading indices): dims of self after
// the indexed ones keep their shards (renumbered after the index dims); index rows sharded alike
// select each rank's rows of the result from a whole self; a Partial self gives the Partial result.
std::vector<DimStrategy> index(const OpSchema& s) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  const auto l = leading_indices(s);
  if (!l) return out;
  for (int64_t d = l->k; d < s.input_ndim(0); ++d)
    out.push_back({{Shard(d - l->k + l->index_ndim)}, indexing_inputs(s, Shard(d), Replicate())});
  if (index_rows_align(s, *l)) out.push_back({{Shard(0)}, indexing_inputs(s, Replicate(), Shard(0))});
  for (auto op : kMovesValues) out.push_back({{Partial(op)}, indexing_inputs(s, Partial(op), Replicate())});
  return out;
}

// index_put(self, indices, values, accumulate): self[indices] = values (+= with accumulate), with
// leading indices (embedding's backward: one index over the rows).
//  - Dims of self after the indexed ones are left alone: sharded alike in self, values and the output.
//  - With accumulate, Partial self and values give the Partial sum; and the index rows, sharded with
//    the values' rows, each rank adding its share of the updates into a Partial(sum) self.
std::vector<DimStrategy> index_put(const OpSchema& s) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  const auto l = leading_indices(s);
  if (!l) return out;
  const size_t values = s.inputs.size() - 1;
  const bool aligned = s.input_ndim(values) == l->index_ndim + s.input_ndim(0) - l->k;
  for (int64_t d = l->k; aligned && d < s.input_ndim(0); ++d)
    if (s.input(values).meta.shape[d - l->k + l->index_ndim] == s.input(0).meta.shape[d])
      out.push_back({{Shard(d)}, indexing_inputs(s, Shard(d), Replicate(), Shard(d - l->k + l->index_ndim))});
  const bool accumulate = s.args.size() > 3 && s.args[3].toBool();
  if (!accumulate) return out;
  const auto linear = linear_reduce_ops(s, {0, values});
  for (auto op : linear) out.push_back({{Partial(op)}, indexing_inputs(s, Partial(op), Replicate(), Partial(op))});
  if (aligned && !linear.empty() && index_rows_align(s, *l) && s.input(1).meta.shape[0] == s.input(values).meta.shape[0])
    out.push_back({{Partial(ReduceOp::Sum)}, indexing_inputs(s, Partial(ReduceOp::Sum), Shard(0), Shard(0))});
  return out;
}

const bool indexing_rules_registered = [] {
  using detail::register_family;
  using enum detail::StridedShards;
  register_family({"aten::index_select"}, {.dim = index_select, .family = "indexing", .strided_shards = IndexWise});
  register_family({"aten::index_add"},
                  {.dim = [](const OpSchema& s) { return index_accumulate(s, true); }, .family = "indexing", .strided_shards = IndexWise});
  register_family({"aten::index_fill"}, {.dim = index_fill, .family = "indexing", .strided_shards = IndexWise});
  register_family({"aten::index_reduce"},
                  {.dim = [](const OpSchema& s) { return index_accumulate(s, false); }, .family = "indexing", .strided_shards = IndexWise});
  register_family({"aten::gather"}, {.dim = gather, .family = "indexing", .strided_shards = IndexWise});
  register_family({"aten::scatter", "aten::scatter_add"}, {.dim = scatter, .family = "indexing", .strided_shards = IndexWise});
  register_family({"aten::index_put", "aten::_index_put_impl"}, {.dim = index_put, .family = "indexing", .strided_shards = IndexWise});
  register_family({"aten::index"}, {.dim = index, .family = "indexing", .strided_shards = IndexWise});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
