// View and shape ops: views, squeezes, slices and selections, splits and concatenations, repeat
// (index gathers and scatters: indexing.cpp). A dim an op leaves whole keeps its shard (renumbered when dims come
// or go); a dim the op cuts, joins along or indexes into must be Replicate. Ops that only move or copy
// values keep every Partial; views run on the local shard, so their results alias it. In-place views
// (t_, transpose_, squeeze_, unsqueeze_) reshape the local shard and dispatch gives the DTensor the
// view's shape and placements.

#include <ATen/ATen.h>
#include <ATen/TensorUtils.h>
#include <torch/library.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <set>

#include "../registry.h"
#include "dtensor/errors.h"
#include "dtensor/layout.h"
#include "form_helpers.h"
#include "optional_tensors.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

bool in_place(const OpSchema& s) { return s.schema.name().back() == '_'; }

// Strategies of an op that only moves, copies or zero-fills values, whose outputs have input dim d as
// dim out_dim(d) (-1: the op cuts or removes it, so it cannot stay sharded). Every tensor input is
// sharded alike (cat, stack).
std::vector<DimStrategy> follow_dims(const OpSchema& s, const std::function<int64_t(int64_t)>& out_dim) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d) {
    const int64_t o = out_dim(d);
    if (o >= 0) out.push_back({Placements(s.outputs.size(), Shard(o)), Placements(s.inputs.size(), Shard(d))});
  }
  for (auto op : kMovesValues)
    out.push_back({Placements(s.outputs.size(), Partial(op)), Placements(s.inputs.size(), Partial(op))});
  return out;
}

// ---- dims reordered or broadcast ------------------------------------------------------------------

// Output dim of each input dim for ops that only reorder dims.
std::vector<int64_t> dim_order(const OpSchema& s) {
  const int64_t ndim = s.input_ndim(0);
  std::vector<int64_t> out_of(ndim);
  for (int64_t d = 0; d < ndim; ++d) out_of[d] = d;
  const std::string name = s.schema.name();
  if (name == "aten::t" || name == "aten::t_" || name == "aten::transpose" || name == "aten::transpose_") {
    if (ndim < 2) return out_of;
    const bool t = name == "aten::t" || name == "aten::t_";
    const int64_t a = t ? 0 : wrap_dim(s.args[1].toInt(), ndim);
    const int64_t b = t ? 1 : wrap_dim(s.args[2].toInt(), ndim);
    std::swap(out_of[a], out_of[b]);
  } else if (name == "aten::permute") {
    const auto dims = s.args[1].toIntVector();
    for (int64_t o = 0; o < ndim; ++o) out_of[wrap_dim(dims[o], ndim)] = o;
  }
  return out_of;
}

std::vector<DimStrategy> reorder(const OpSchema& s) {
  const auto out_of = dim_order(s);
  return follow_dims(s, [&](int64_t d) { return out_of[d]; });
}

// expand: input dims align with the output's trailing dims; a dim that is not broadcast keeps its
// shard, a broadcast one (size 1) cannot be sharded.
std::vector<DimStrategy> expand(const OpSchema& s) {
  const Shape& in = s.input(0).meta.shape;
  const Shape& out = s.outputs[0].shape;
  const int64_t offset = static_cast<int64_t>(out.size() - in.size());
  return follow_dims(s, [&](int64_t d) { return in[d] == out[d + offset] ? d + offset : -1; });
}

// repeat: like expand, but a repeated dim is tiled, so only dims repeated once keep their shards.
std::vector<DimStrategy> repeat(const OpSchema& s) {
  const auto repeats = s.args[1].toIntVector();
  const int64_t offset = static_cast<int64_t>(repeats.size()) - s.input_ndim(0);
  return follow_dims(s, [&](int64_t d) { return repeats[d + offset] == 1 ? d + offset : -1; });
}

// ---- view, _unsafe_view, _reshape_alias -----------------------------------------------------------

// Whether a shard of a dim of `a` elements, each a block of `inner_in` elements, is the same run of
// elements as the shard of a dim of `b` elements with blocks of `inner_out`, for every mesh
// coordinate (`on_dim`: the placements chunking this dim, as Shard(0)).
bool same_runs(int64_t a, int64_t inner_in, int64_t b, int64_t inner_out, const Shape& mesh_shape,
               const Placements& on_dim) {
  Shape coordinate(mesh_shape.size(), 0);
  for (int64_t k = 0; k < numel(mesh_shape); ++k) {
    for (int64_t m = static_cast<int64_t>(mesh_shape.size()) - 1, rest = k; m >= 0; rest /= mesh_shape[m--])
      coordinate[m] = rest % mesh_shape[m];
    const LocalLayout x = local_layout({a}, mesh_shape, coordinate, on_dim);
    const LocalLayout y = local_layout({b}, mesh_shape, coordinate, on_dim);
    if (x.shape[0] * inner_in != y.shape[0] * inner_out || x.offset[0] * inner_in != y.offset[0] * inner_out)
      return false;
  }
  return true;
}

// The output dim that input dim d stays sharded as through a view from `in` to `out`, or -1. The
// view splits, merges or regroups dims within runs of equal element counts; d's shard is a run of
// whole rows of the output dim o that starts at d's place (the same count of elements before it)
// when, for every rank, d's chunk times the elements within each index of d is o's chunk times the
// elements within each index of o. E.g. [B, S, H*D] -> [B, S, H, D] keeps a shard of H*D as a shard
// of H when every chunk of H*D is whole rows of D at chunk boundaries of H. The check uses global
// shapes and mesh sizes only, so every rank decides alike.
int64_t view_target(const Shape& in, const Shape& out, int64_t d, const Shape& mesh_shape, const Placements& on_dim) {
  if (in[d] == 1) return -1;
  const int64_t before = numel(Shape(in.begin(), in.begin() + d));
  const int64_t inner_in = numel(Shape(in.begin() + d + 1, in.end()));
  int64_t before_out = 1;
  for (size_t o = 0; o < out.size() && before_out <= before; before_out *= out[o++]) {
    if (before_out != before || out[o] == 1) continue;
    const int64_t inner_out = numel(Shape(out.begin() + o + 1, out.end()));
    return same_runs(in[d], inner_in, out[o], inner_out, mesh_shape, on_dim) ? static_cast<int64_t>(o) : -1;
  }
  return -1;
}

// Where a sharding placement of the input (along mesh dim m) goes through the op: the output's
// placement, or nullopt when the op cannot keep it (its dim is then replicated first).
using ShardingTarget = std::function<std::optional<Placement>(const Placement&, int64_t m)>;

// The input's own placements where the op keeps them: a sharding becomes target(it), or Replicate
// (the input replicated there first) where there is none; Partial stays when `keep_partial`.
OpStrategy keep_where_possible(const OpSchema& s, const ShardingTarget& target, bool keep_partial) {
  Placements in = s.input(0).placements, out = in;
  for (size_t m = 0; m < in.size(); ++m) {
    const auto o = in[m].is_sharding() ? target(in[m], static_cast<int64_t>(m)) : std::nullopt;
    if ((in[m].is_sharding() && !o) || (in[m].is_partial() && !keep_partial)) in[m] = out[m] = Replicate();
    else if (o) out[m] = *o;
  }
  return {PlacementStrategy{{out}, {in}, {}}};
}

// The mesh dims that shard tensor dim d, as Shard(0) of that dim alone.
Placements chunking_of(const Placements& placements, int64_t d) {
  Placements out;
  for (const auto& p : placements) out.push_back(p.is_shard(d) ? Shard(0) : Replicate());
  return out;
}

bool is_dtype_view(const OpSchema& s) { return s.schema.overload_name() == "dtype"; }

// view.dtype reinterprets the bytes: only the last dim changes size (when the element size does),
// and the values are not those of a sum, so Partial must be reduced first.
OpStrategy dtype_view(const OpSchema& s) {
  const Shape& in = s.input(0).meta.shape;
  const bool resized = !in.empty() && s.outputs[0].shape.back() != in.back();
  const int64_t last = static_cast<int64_t>(in.size()) - 1;
  return keep_where_possible(
      s, [&](const Placement& p, int64_t) { return resized && p.dim() == last ? std::nullopt : std::optional(p); },
      false);
}

// Elements before each dim of a shape: prefix[i] = shape[0] * ... * shape[i-1], for i up to ndim.
Shape elements_before(const Shape& shape) {
  Shape prefix = {1};
  for (int64_t size : shape) prefix.push_back(prefix.back() * size);
  return prefix;
}

// Where StridedShard(d, split) (Shard(d) when split is 1) of the input goes through a view from `in`
// to `out`, the runs of elements it holds kept as they are (checked for every mesh coordinate by
// same_runs, with `on_dim` the one mesh dim sharding d):
//  - an output dim made of whole input dims including d: the dims before d multiply the blocks (a
//    merge: [8,12] S(1) -> [96] SS(0,8); [15,4] SS(0,3) -> [60] SS(0,3)), and it is a Shard again
//    where there is one block;
//  - d split into output dims: the dim where the blocks end holds the shard ([96] SS(0,8) ->
//    [8,12] S(1)).
std::optional<Placement> strided_view_target(const Shape& in, const Shape& out, const Placement& p,
                                             const Shape& mesh_shape, const Placements& on_dim) {
  const int64_t d = p.dim(), split = p.split_factor(), block = in[d] / split;
  if (in[d] <= 1) return std::nullopt;
  const Shape in_before = elements_before(in), out_before = elements_before(out);
  auto input_boundary = [&](int64_t elements) {
    return std::find(in_before.begin(), in_before.end(), elements) != in_before.end();
  };
  for (size_t o = 0; o < out.size(); ++o) {
    if (out[o] == 1) continue;
    // An output dim of whole input dims, d among them.
    if (out_before[o] <= in_before[d] && in_before[d + 1] <= out_before[o + 1] && input_boundary(out_before[o]) &&
        input_boundary(out_before[o + 1])) {
      const int64_t inner = out_before[o + 1] / in_before[d + 1];
      if (!same_runs(block, inner, block * inner, 1, mesh_shape, on_dim)) return std::nullopt;
      return Placement::strided_shard(static_cast<int64_t>(o), in_before[d] / out_before[o] * split);
    }
    // An output dim inside d that starts where d's blocks end.
    if (in_before[d] < out_before[o] && out_before[o + 1] <= in_before[d + 1] && out_before[o] == in_before[d] * split &&
        input_boundary(in_before[d + 1])) {
      const int64_t inner = in_before[d + 1] / out_before[o + 1];
      if (!same_runs(block, 1, out[o], inner, mesh_shape, on_dim)) return std::nullopt;
      return Shard(static_cast<int64_t>(o));
    }
  }
  return std::nullopt;
}

// A HeadTailShard through a view: its runs stay runs only where an output dim is its dim whole, the
// same elements before it (a [B, S, H*D] -> [B, S, H, D] view keeps a sequence's head-tail shard).
std::optional<Placement> kept_whole(const Shape& in, const Shape& out, const Placement& p) {
  const Shape in_before = elements_before(in), out_before = elements_before(out);
  for (size_t o = 0; o < out.size(); ++o)
    if (out[o] == in[p.dim()] && out_before[o] == in_before[p.dim()]) return p.with_dim(static_cast<int64_t>(o));
  return std::nullopt;
}

// A view computes on global shapes only when the shards align with it: a Shard stays one (see
// view_target), or becomes a StridedShard where the view merges its dim into dims before it; a
// StridedShard follows its blocks (strided_view_target), a HeadTailShard its dim kept whole (kept_whole).
// Any other sharded dim is replicated first,
// and the view then runs on the replicated data. A strategy with strided shards comes with one
// without them (which replicates instead), for callers that cannot take them (graph programs).
OpStrategy view(const OpSchema& s) {
  if (is_dtype_view(s)) return dtype_view(s);
  const Shape& in = s.input(0).meta.shape;
  const Shape& out = s.outputs[0].shape;
  const Placements& placements = s.input(0).placements;
  // Without elements there are no runs to line up (and element counts say nothing): replicate.
  if (numel(in) == 0) return keep_where_possible(s, [](const Placement&, int64_t) { return std::nullopt; }, true);
  auto target = [&](const Placement& p, int64_t m, bool strided) -> std::optional<Placement> {
    if (p.is_shard()) {
      const Placements on_dim = chunking_of(placements, p.dim());
      if (const int64_t o = view_target(in, out, p.dim(), s.mesh->shape(), on_dim); o >= 0) return Shard(o);
      if (std::count(on_dim.begin(), on_dim.end(), Shard(0)) != 1) return std::nullopt;  // see StridedShard
    }
    if (!strided) return std::nullopt;
    if (p.is_head_tail_shard()) return kept_whole(in, out, p);
    return strided_view_target(in, out, p, {s.mesh->size(m)}, {Shard(0)});
  };
  OpStrategy with = keep_where_possible(s, [&](const Placement& p, int64_t m) { return target(p, m, true); }, true);
  OpStrategy without = keep_where_possible(s, [&](const Placement& p, int64_t m) { return target(p, m, false); }, true);
  if (with.front().outputs == without.front().outputs && with.front().inputs == without.front().inputs) return with;
  return {with.front(), without.front()};
}

// The `size` argument (index 1) is global; the local call needs this rank's output shape.
LocalArgs local_size_arg(const OpSchema& s, const PlacementStrategy& chosen) {
  return {{1, c10::IValue(local_output_shape(s, chosen))}};
}

LocalArgs view_local_args(const OpSchema& s, const PlacementStrategy& chosen) {
  return is_dtype_view(s) ? LocalArgs{} : local_size_arg(s, chosen);
}

// Shards are laid out in their DTensor's dim order (in_global_layout), so a view that is legal on the
// global tensor is legal on the shard. Should a shard still not be viewable, the view is refused: a
// copy would silently lose writes made through the "view".
LocalKernel view_kernel(const OpSchema& s, const PlacementStrategy&) {
  return [name = s.op_name()](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    c10::IValue* args = stack.data() + stack.size() - 2;
    if (args[1].isIntList()) {
      const at::Tensor& self = args[0].toTensor();
      const auto size = args[1].toIntVector();
      if (!at::detail::computeStride(self.sizes(), self.strides(), size))
        throw DTensorError(name + ": this rank's shard of shape " + shape_str(self.sizes().vec()) + " and strides " +
                           shape_str(self.strides().vec()) + " cannot be viewed as " + shape_str(size) +
                           " without a copy, which would not see writes made through the view; use reshape (or "
                           "contiguous() first)");
    }
    op.callBoxed(stack);
  };
}

// _reshape_alias also takes the view's strides: the local ones follow from the local shard's.
LocalKernel reshape_alias_kernel(const OpSchema& s, const PlacementStrategy&) {
  return [name = s.op_name()](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    c10::IValue* args = stack.data() + stack.size() - 3;
    const at::Tensor& self = args[0].toTensor();
    const auto size = args[1].toIntVector();
    const auto stride = at::detail::computeStride(self.sizes(), self.strides(), size);
    if (!stride)
      throw DTensorError(name + ": the local shard of shape " + shape_str(self.sizes().vec()) +
                         " cannot be viewed as " + shape_str(size) + " with its strides; make it contiguous first");
    args[2] = c10::IValue(*stride);
    op.callBoxed(stack);
  };
}

// In a graph the strides need no computing: the view of the local shard is what _reshape_alias makes
// of it (and view refuses a shard that cannot be viewed, as the kernel does).
GraphForm reshape_alias_form(const OpSchema&, const PlacementStrategy&) {
  return [](GraphFormBuilder& b) { return std::vector<FormValue>{b.op("aten::view", {b.input(0), FormArg::as_called(1)}, "local")}; };
}

// ---- squeeze, unsqueeze ----------------------------------------------------------------------------

// The dims a squeeze removes: those asked for (all when none are) that are 1 in the global shape. A
// sharded dim can be 1 in a local shard only, so a squeeze of local shards must be told these dims.
std::vector<int64_t> squeezed_dims(const OpSchema& s) {
  const Shape& global_shape = s.input(0).meta.shape;
  const auto ndim = static_cast<int64_t>(global_shape.size());
  std::vector<int64_t> asked;
  if (s.args.size() == 1) {
    for (int64_t d = 0; d < ndim; ++d) asked.push_back(d);
  } else if (s.args[1].isInt()) {
    asked.push_back(wrap_dim(s.args[1].toInt(), ndim));
  } else {
    for (int64_t d : s.args[1].toIntVector()) asked.push_back(wrap_dim(d, ndim));
  }
  std::vector<int64_t> out;
  for (int64_t d : asked)
    if (d < ndim && global_shape[d] == 1 && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<DimStrategy> squeeze(const OpSchema& s) {
  const auto removed = squeezed_dims(s);
  return follow_dims(s, [&](int64_t d) {
    const auto before = std::lower_bound(removed.begin(), removed.end(), d);
    return before != removed.end() && *before == d ? -1 : d - (before - removed.begin());
  });
}

// Every squeeze overload runs locally as squeeze.dims with the globally squeezed dims.
LocalKernel squeeze_kernel(const OpSchema& s, const PlacementStrategy&) {
  return [dims = squeezed_dims(s), inplace = in_place(s)](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    at::Tensor self = stack[stack.size() - op.schema().arguments().size()].toTensor();
    torch::jit::drop(stack, op.schema().arguments().size());
    stack.push_back(inplace ? self.squeeze_(dims) : at::squeeze(self, dims));
  };
}

GraphForm squeeze_form(const OpSchema& s, const PlacementStrategy&) {
  return [dims = squeezed_dims(s)](GraphFormBuilder& b) -> std::vector<FormValue> {
    return {b.op("aten::squeeze.dims", {b.input(0), dims}, "squeeze")};
  };
}

// unsqueeze (and stack, which unsqueezes every input then joins them): dims from `dim` on move up.
std::vector<DimStrategy> unsqueeze(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.output_ndim());
  return follow_dims(s, [dim](int64_t d) { return d >= dim ? d + 1 : d; });
}

// ---- slices, selections, splits, concatenation ----------------------------------------------------

// slice, and slice_backward (the slice's gradient placed into zeros of the input's shape, the same
// zeros on every rank), keep a shard of the sliced dim only when the slice is the whole dim.
std::vector<DimStrategy> slice(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.output_ndim());
  const bool whole = s.outputs[0].shape[dim] == s.input(0).meta.shape[dim];
  return follow_dims(s, [&](int64_t d) { return d == dim && !whole ? -1 : d; });
}

// select and unbind remove `dim`; select_backward puts it back.
std::vector<DimStrategy> select(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.input_ndim(0));
  return follow_dims(s, [dim](int64_t d) { return d == dim ? -1 : d > dim ? d - 1 : d; });
}

std::vector<DimStrategy> select_backward(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.output_ndim());
  return follow_dims(s, [dim](int64_t d) { return d >= dim ? d + 1 : d; });
}

// split and cat cut or join along `dim`; other dims keep their shards (on every input alike).
std::vector<DimStrategy> along_dim(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.output_ndim());
  return follow_dims(s, [dim](int64_t d) { return d == dim ? -1 : d; });
}

// ---- packed layers: split into blocks, cat back -----------------------------------------------------
// A packed layer's output is StridedShard(dim, k): each rank holds its piece of every one of the k
// blocks (q, k and v; gate and up). Split into its k equal blocks, each block is a plain Shard(dim)
// where it is; cat of k equal Shard(dim) pieces along dim is the StridedShard(dim, k) of the whole,
// the local cat being this rank's piece of each block. Neither moves data (GPT-2's c_attn, forward and
// backward).

// The input's StridedShard along the split dim in k blocks, if it has one.
std::optional<Placement> packed_blocks(const OpSchema& s, int64_t dim) {
  const auto pieces = static_cast<int64_t>(s.outputs.size());
  for (const TensorMeta& o : s.outputs)
    if (o.shape.at(dim) != s.outputs[0].shape.at(dim)) return std::nullopt;
  for (const Placement& p : s.input(0).placements)
    if (p.is_strided_shard() && p.dim() == dim && p.split_factor() == pieces) return p;
  return std::nullopt;
}

// split, split_with_sizes and chunk: along_dim's strategies, plus the packed blocks. The rule sees strided
// inputs as they are (StridedShards::Own): any other strided input is moved to one of along_dim's.
std::vector<DimStrategy> split_packed(const OpSchema& s) {
  std::vector<DimStrategy> out = along_dim(s);
  const int64_t dim = dim_arg(s, s.output_ndim());
  if (auto p = packed_blocks(s, dim)) out.push_back({Placements(s.outputs.size(), Shard(dim)), {*p}});
  return out;
}

// Splitting packed blocks locally cuts this rank's pieces: sizes become the local blocks'.
LocalArgs split_packed_args(const OpSchema& s, const PlacementStrategy& chosen) {
  const int64_t dim = dim_arg(s, s.output_ndim());
  const Placements& in = chosen.inputs[0];
  if (std::none_of(in.begin(), in.end(), [&](const Placement& p) { return p.is_strided_shard() && p.dim() == dim; })) return {};
  const int64_t piece = local_output_shape(s, chosen)[dim];
  if (s.args[1].isIntList()) return {{1, c10::IValue(std::vector<int64_t>(s.outputs.size(), piece))}};
  return {{1, c10::IValue(piece)}};
}

// cat: along_dim's strategies, plus k equal Shard(dim) pieces joined into StridedShard(dim, k).
std::vector<DimStrategy> cat_packed(const OpSchema& s) {
  std::vector<DimStrategy> out = along_dim(s);
  const int64_t dim = dim_arg(s, s.output_ndim());
  const auto pieces = static_cast<int64_t>(s.inputs.size());
  bool equal = pieces > 1;
  for (size_t k = 0; k < s.inputs.size(); ++k)
    equal = equal && s.input(k).meta.shape.size() == s.outputs[0].shape.size() &&
            s.input(k).meta.shape.at(dim) * pieces == s.outputs[0].shape.at(dim);
  if (equal) out.push_back({{Placement::strided_shard(dim, pieces)}, Placements(s.inputs.size(), Shard(dim))});
  return out;
}

// constant_pad_nd(self, pad, value): pad holds (before, after) amounts from the last dim backwards;
// a negative amount crops. A dim with a non-zero amount must be Replicate (the shards' edges are not
// the tensor's); every other dim keeps its shard. Every rank writes the same `value` where it pads,
// which Avg, Max and Min reduce back to `value`, so those Partials stay; Sum only when `value` is 0
// (or nothing is padded), as each rank's copy would otherwise count once.
std::vector<DimStrategy> constant_pad_nd(const OpSchema& s) {
  const int64_t ndim = s.input_ndim(0);
  const std::vector<int64_t> pad = argument(s, "pad").toIntVector();
  std::vector<bool> padded(ndim, false);
  for (size_t i = 0; i + 1 < pad.size(); i += 2)
    if (pad[i] != 0 || pad[i + 1] != 0) padded.at(ndim - 1 - static_cast<int64_t>(i / 2)) = true;
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < ndim; ++d)
    if (!padded[d]) out.push_back({{Shard(d)}, {Shard(d)}});
  const bool pads_nothing = std::none_of(padded.begin(), padded.end(), [](bool p) { return p; });
  for (auto op : kMovesValues)
    if (op != ReduceOp::Sum || pads_nothing || argument(s, "value").toScalar().equal(0))
      out.push_back({{Partial(op)}, {Partial(op)}});
  return out;
}

// triu and tril keep the elements on one side of a diagonal of the last two dims (column - row >=
// diagonal, or <=) and zero the rest. Every dim may stay sharded: a rank whose block starts at global
// row r0 and column c0 applies diagonal + r0 - c0 to it (triangle_args). Zeroing commutes with every
// Partial reduction, so each passes through.
std::vector<DimStrategy> triangle(const OpSchema& s) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d) out.push_back({{Shard(d)}, {Shard(d)}});
  // A strided shard of a batch dim holds whole matrices, which tril/triu zero alike (an in-place form
  // in a derivative keeps the gradient's layout).
  for (const Placement& p : s.input(0).placements)
    if (p.is_strided_shard() && p.dim() < s.input_ndim(0) - 2) out.push_back({{p}, {p}});
  for (auto op : kMovesValues) out.push_back({{Partial(op)}, {Partial(op)}});
  return out;
}

LocalArgs triangle_args(const OpSchema& s, const PlacementStrategy& chosen) {
  const Shape& shape = s.input(0).meta.shape;
  const auto rows = static_cast<size_t>(s.input_ndim(0) - 2), cols = rows + 1;
  // Only shards of the matrix dims move the diagonal (batch dims may be strided shards: no block).
  const auto& placements = chosen.inputs[0];
  if (std::none_of(placements.begin(), placements.end(), [&](const Placement& p) { return p.is_sharding() && p.dim() >= static_cast<int64_t>(rows); }))
    return {};
  const LocalLayout block = local_layout(shape, s.mesh->shape(), *s.mesh->coordinate(), chosen.inputs[0]);
  const int64_t shift = block.offset[rows] - block.offset[cols];
  if (shift == 0) return {};
  return {{1, c10::IValue(argument(s, "diagonal").toInt() + shift)}};
}

// view_as_complex reads the last dim's (real, imaginary) pairs as one complex element, so that dim
// must be whole; view_as_real splits each element back into a last dim of 2. The other dims keep their
// shards, and as both are linear, Partial sums and averages pass through (max and min have no complex
// meaning).
std::vector<DimStrategy> complex_pairs(const OpSchema& s, int64_t kept_dims) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < kept_dims; ++d) out.push_back({{Shard(d)}, {Shard(d)}});
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{Partial(op)}, {Partial(op)}});
  return out;
}

// slice_scatter(self, src, dim, ...): self with a slice of `dim` replaced by src (of self's shape
// but along `dim`). Other dims keep their shards in self, src and the output alike; every reduction
// of Partial values commutes with writing one into the other elementwise.
std::vector<DimStrategy> slice_scatter(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.input_ndim(0));
  return follow_dims(s, [dim](int64_t d) { return d == dim ? -1 : d; });
}

// ---- diagonals, rolls and scatters into views ---------------------------------------------------------

// Where dim d lands once dims a and b are taken out (-1 for a and b themselves).
int64_t without_two(int64_t d, int64_t a, int64_t b) { return d == a || d == b ? -1 : d - (d > a) - (d > b); }

struct DiagonalDims {
  int64_t a, b;
};

DiagonalDims diagonal_dims(const OpSchema& s, int64_t ndim) {
  return {wrap_dim(argument(s, "dim1").toInt(), ndim), wrap_dim(argument(s, "dim2").toInt(), ndim)};
}

// diagonal(self, offset, dim1, dim2), also as a copy: dim1 and dim2 become the output's last dim,
// whole; the other dims keep their shards.
std::vector<DimStrategy> diagonal(const OpSchema& s) {
  const DiagonalDims dims = diagonal_dims(s, s.input_ndim(0));
  return follow_dims(s, [dims](int64_t d) { return without_two(d, dims.a, dims.b); });
}

// diag_embed(self, offset, dim1, dim2): the input's last dim becomes the diagonal of the output's dims
// dim1 and dim2; its other dims fill the output's remaining dims in order.
std::vector<DimStrategy> diag_embed(const OpSchema& s) {
  const int64_t n = s.output_ndim();
  const DiagonalDims dims = diagonal_dims(s, n);
  std::vector<int64_t> rest;
  for (int64_t o = 0; o < n; ++o)
    if (o != dims.a && o != dims.b) rest.push_back(o);
  const int64_t last = s.input_ndim(0) - 1;
  return follow_dims(s, [&](int64_t d) { return d < last ? rest[static_cast<size_t>(d)] : -1; });
}

// roll(self, shifts, dims): a rolled dim must be whole; with no dims the flattened tensor rolls, so
// every dim must.
std::vector<DimStrategy> roll(const OpSchema& s) {
  const int64_t n = s.input_ndim(0);
  std::set<int64_t> rolled;
  for (int64_t d : argument(s, "dims").toIntVector()) rolled.insert(wrap_dim(d, n));
  const bool flattened = rolled.empty();
  return follow_dims(s, [&](int64_t d) { return flattened || rolled.count(d) ? -1 : d; });
}

// select_scatter(self, src, dim, index) and diagonal_scatter(self, src, offset, dim1, dim2): src
// written into a view of self. self and the output keep a shard on dim d, src on where d is in the
// view. Positions come from self or from src, never both, so every Partial reduction commutes.
std::vector<DimStrategy> into_view(const OpSchema& s, const std::function<int64_t(int64_t)>& view_dim) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d)
    if (const int64_t v = view_dim(d); v >= 0) out.push_back({{Shard(d)}, {Shard(d), Shard(v)}});
  for (auto op : kMovesValues) out.push_back({{Partial(op)}, {Partial(op), Partial(op)}});
  return out;
}

std::vector<DimStrategy> select_scatter(const OpSchema& s) {
  const int64_t dim = dim_arg(s, s.input_ndim(0));
  return into_view(s, [dim](int64_t d) { return d == dim ? -1 : d > dim ? d - 1 : d; });
}

std::vector<DimStrategy> diagonal_scatter(const OpSchema& s) {
  const DiagonalDims dims = diagonal_dims(s, s.input_ndim(0));
  return into_view(s, [dims](int64_t d) { return without_two(d, dims.a, dims.b); });
}

// diagonal's backward copies the gradient into the diagonal of a plain at::zeros, which cannot hold a
// DTensor's values; DTensors get the out-of-place form on zeros made from the gradient (still
// recorded by autograd, so it stays differentiable).
at::Tensor diagonal_backward(const at::Tensor& grad, c10::SymIntArrayRef input_sizes, int64_t offset, int64_t dim1, int64_t dim2) {
  return at::diagonal_scatter(grad.new_zeros_symint(input_sizes), grad, offset, dim1, dim2);
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse2, m) { m.impl("diagonal_backward", TORCH_FN(diagonal_backward)); }

const bool view_rules_registered = [] {
  using detail::register_family;
  using enum detail::StridedShards;
  register_family({"aten::expand"}, {.dim = expand, .local_args = local_size_arg, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::t", "aten::transpose", "aten::permute", "aten::detach", "aten::alias"},
                  {.dim = reorder, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::repeat"}, {.dim = repeat, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::view", "aten::_unsafe_view"},
                  {.mesh = view, .local_args = view_local_args, .local_kernel = view_kernel, .family = "view", .strided_shards = Own});
  // reshape (composite: a view or a copy) shards like the view; a copy of the shard is legal here.
  detail::register_composite({"aten::reshape"},
                             {.mesh = view, .local_args = local_size_arg, .family = "composite", .strided_shards = Own});
  register_family({"aten::_reshape_alias"},
                  {.mesh = view, .local_args = local_size_arg, .local_kernel = reshape_alias_kernel, .graph_form = reshape_alias_form,
                   .family = "view", .strided_shards = Own});
  register_family({"aten::squeeze"}, {.dim = squeeze, .local_kernel = squeeze_kernel, .graph_form = squeeze_form, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::unsqueeze", "aten::stack"}, {.dim = unsqueeze, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::slice"}, {.dim = slice, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::slice_backward"}, {.dim = slice, .local_args = local_size_arg, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::select", "aten::unbind"}, {.dim = select, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::select_backward"}, {.dim = select_backward, .local_args = local_size_arg, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::split", "aten::split_with_sizes", "aten::split_with_sizes_copy"},
                  {.dim = split_packed, .local_args = split_packed_args, .family = "view", .strided_shards = Own});
  // chunk (composite: a split into `chunks` pieces) keeps its piece count on the shards: k chunks of
  // StridedShard(dim, k) are this rank's k blocks.
  detail::register_composite({"aten::chunk"}, {.dim = split_packed, .family = "composite", .strided_shards = Own});
  register_family({"aten::cat"}, {.dim = cat_packed, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::slice_scatter"}, {.dim = slice_scatter, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::constant_pad_nd"}, {.dim = constant_pad_nd, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::view_as_complex"},
                  {.dim = [](const OpSchema& s) { return complex_pairs(s, s.input_ndim(0) - 1); }, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::view_as_real"},
                  {.dim = [](const OpSchema& s) { return complex_pairs(s, s.input_ndim(0)); }, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::triu", "aten::tril"}, {.dim = triangle, .local_args = triangle_args, .family = "view", .strided_shards = Own});
  register_family({"aten::diagonal", "aten::diagonal_copy"}, {.dim = diagonal, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::diag_embed"}, {.dim = diag_embed, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::roll"}, {.dim = roll, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::select_scatter"}, {.dim = select_scatter, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::diagonal_scatter"}, {.dim = diagonal_scatter, .family = "view", .strided_shards = IndexWise});
  register_family({"aten::expand_copy"}, {.dim = expand, .local_args = local_size_arg, .family = "view", .strided_shards = IndexWise});
  // The view's copy (of a shape or a dtype): placed as the view, run on the shard with its local size
  // (a copy needs no view kernel).
  register_family({"aten::view_copy"}, {.mesh = view, .local_args = view_local_args, .family = "view", .strided_shards = Own});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
