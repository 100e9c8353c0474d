// Matrix products. Sharding a free dim of either operand shards the output; sharding the contracted
// dim on both gives a Partial(sum) output; a Partial operand times a Replicate one stays Partial
// (Avg only for floating values, see linear_reduce_ops). linear and matmul, which eager dispatch sees
// as their parts (mm, addmm, bmm, ...), have rules of their own for exported graphs.

#include "../registry.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

// A Partial operand times a Replicate one stays Partial (for the reductions a product is linear in).
std::vector<DimStrategy> with_partial_operands(const OpSchema& s, std::vector<DimStrategy> out) {
  for (auto op : linear_reduce_ops(s)) {
    out.push_back({{Partial(op)}, {Partial(op), Replicate()}});
    out.push_back({{Partial(op)}, {Replicate(), Partial(op)}});
  }
  return out;
}

// Placements of (lhs, rhs) -> out for a batched product with `batch` leading dims:
// lhs [..., m, k] @ rhs [..., k, n] -> out [..., m, n].
std::vector<DimStrategy> product(const OpSchema& s, int64_t batch) {
  const int64_t m = batch, k = batch + 1, n = batch + 1;  // dims of lhs (m, k) and rhs (k, n)
  std::vector<DimStrategy> out = {
      {{Replicate()}, {Replicate(), Replicate()}},
      {{Shard(m)}, {Shard(m), Replicate()}},
      {{Shard(batch + 1)}, {Replicate(), Shard(n)}},
      {{Partial()}, {Shard(k), Shard(batch)}},
  };
  for (int64_t b = 0; b < batch; ++b) out.push_back({{Shard(b)}, {Shard(b), Shard(b)}});
  return with_partial_operands(s, std::move(out));
}

std::vector<DimStrategy> mm(const OpSchema& s) { return product(s, 0); }
std::vector<DimStrategy> bmm(const OpSchema& s) { return product(s, 1); }

// self + a @ b: the added term follows the product's output, broadcast from the right.
std::vector<DimStrategy> add_product(const OpSchema& s, int64_t batch) {
  const Shape& out = s.outputs[0].shape;
  const Shape& self = s.input(0).meta.shape;
  std::vector<DimStrategy> result;
  for (const DimStrategy& p : product(s, batch)) {
    DimStrategy st{p.outputs, {}};
    const Placement& o = p.outputs[0];
    Placement self_placement = o;
    if (o.is_shard()) {
      const int64_t d = o.dim() - (static_cast<int64_t>(out.size()) - static_cast<int64_t>(self.size()));
      self_placement = d >= 0 && self[d] == out[o.dim()] ? Shard(d) : Replicate();
    }
    st.inputs = {self_placement, p.inputs[0], p.inputs[1]};
    // A Partial product adds a Partial self (a Replicate self is partitioned, for free).
    result.push_back(std::move(st));
  }
  return result;
}

// dot: [k] . [k] -> []; mv: [m, k] @ [k] -> [m].
std::vector<DimStrategy> dot(const OpSchema& s) {
  return with_partial_operands(s, {{{Replicate()}, {Replicate(), Replicate()}}, {{Partial()}, {Shard(0), Shard(0)}}});
}
std::vector<DimStrategy> mv(const OpSchema& s) {
  return with_partial_operands(s, {{{Replicate()}, {Replicate(), Replicate()}},
                                   {{Shard(0)}, {Shard(0), Replicate()}},
                                   {{Partial()}, {Shard(1), Shard(0)}}});
}

// linear(x [..., k], weight [n, k], bias? [n]) -> [..., n]. Row-parallel (k sharded) gives partial
// products; the bias then joins as Partial, partitioned for free (only one rank adds it).
std::vector<DimStrategy> linear(const OpSchema& s) {
  if (s.input_ndim(1) != 2) return {all_replicate(s)};  // a 1-d weight contracts x's last dim away
  const bool has_bias = s.inputs.size() == 3;
  const int64_t last = s.input_ndim(0) - 1;
  auto strategy = [&](Placement out, Placement x, Placement weight, Placement bias) {
    DimStrategy st{{out}, {x, weight}};
    if (has_bias) st.inputs.push_back(bias);
    return st;
  };
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t b = 0; b < last; ++b) out.push_back(strategy(Shard(b), Shard(b), Replicate(), Replicate()));
  out.push_back(strategy(Shard(last), Replicate(), Shard(0), Shard(0)));
  out.push_back(strategy(Partial(), Shard(last), Shard(1), Partial()));
  for (auto op : linear_reduce_ops(s)) {
    out.push_back(strategy(Partial(op), Partial(op), Replicate(), Partial(op)));
    out.push_back(strategy(Partial(op), Replicate(), Partial(op), Partial(op)));
  }
  return out;
}

// matmul(x, y) with torch.matmul's cases: 1-d operands are a vector contracted away; leading (batch)
// dims broadcast from the right, and one is sharded on the operands that have it at full size.
std::vector<DimStrategy> matmul(const OpSchema& s) {
  const Shape& xs = s.input(0).meta.shape;
  const Shape& ys = s.input(1).meta.shape;
  const Shape& os = s.outputs[0].shape;
  const int64_t xn = static_cast<int64_t>(xs.size()), yn = static_cast<int64_t>(ys.size());
  const int64_t on = static_cast<int64_t>(os.size());
  std::vector<DimStrategy> out = {all_replicate(s), {{Partial()}, {Shard(xn - 1), Shard(yn == 1 ? 0 : yn - 2)}}};
  if (xn >= 2) out.push_back({{Shard(yn == 1 ? on - 1 : on - 2)}, {Shard(xn - 2), Replicate()}});
  if (yn >= 2) out.push_back({{Shard(on - 1)}, {Replicate(), Shard(yn - 1)}});
  const int64_t batch = on - (xn >= 2) - (yn >= 2);
  // Operand dim under output batch dim b, when the operand has it at full size (not broadcast).
  auto operand_dim = [&](const Shape& shape, int64_t n, int64_t b) -> std::optional<int64_t> {
    const int64_t d = b - (batch - std::max<int64_t>(n - 2, 0));
    if (d < 0 || n < 2 || shape[d] != os[b]) return std::nullopt;
    return d;
  };
  for (int64_t b = 0; b < batch; ++b) {
    const auto xd = operand_dim(xs, xn, b), yd = operand_dim(ys, yn, b);
    if (!xd && !yd) continue;
    out.push_back({{Shard(b)}, {xd ? Placement(Shard(*xd)) : Replicate(), yd ? Placement(Shard(*yd)) : Replicate()}});
  }
  return with_partial_operands(s, std::move(out));
}

const bool matrix_rules_registered = [] {
  // Exact overloads: the families' .dtype forms (out_dtype matmuls) have no CPU kernels.
  using detail::register_overloads;
  register_overloads({"aten::mm"}, {.dim = mm, .family = "matrix", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::bmm"}, {.dim = bmm, .family = "matrix", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::addmm", "aten::addmm_"},
                     {.dim = [](const OpSchema& s) { return add_product(s, 0); }, .family = "matrix", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::baddbmm", "aten::baddbmm_"},
                     {.dim = [](const OpSchema& s) { return add_product(s, 1); }, .family = "matrix", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::dot"}, {.dim = dot, .family = "matrix", .strided_shards = detail::StridedShards::IndexWise});
  register_overloads({"aten::mv"}, {.dim = mv, .family = "matrix", .strided_shards = detail::StridedShards::IndexWise});
  detail::register_composite({"aten::linear"}, {.dim = linear, .family = "composite"});
  detail::register_composite({"aten::matmul"}, {.dim = matmul, .family = "composite"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
