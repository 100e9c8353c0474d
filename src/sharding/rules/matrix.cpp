// Matrix products. Sharding a free dim of either operand shards the output; sharding the contracted
// dim on both gives a Partial(sum) output; a Partial operand times a Replicate one stays Partial
// (Avg only for floating values, see linear_reduce_ops).

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

const bool registered = [] {
  // Exact overloads: the families' .dtype forms (out_dtype matmuls) have no CPU kernels.
  using detail::register_overloads;
  register_overloads({"aten::mm"}, {.dim = mm, .family = "matrix"});
  register_overloads({"aten::bmm"}, {.dim = bmm, .family = "matrix"});
  register_overloads({"aten::addmm", "aten::addmm_"},
                     {.dim = [](const OpSchema& s) { return add_product(s, 0); }, .family = "matrix"});
  register_overloads({"aten::baddbmm", "aten::baddbmm_"},
                     {.dim = [](const OpSchema& s) { return add_product(s, 1); }, .family = "matrix"});
  register_overloads({"aten::dot"}, {.dim = dot, .family = "matrix"});
  register_overloads({"aten::mv"}, {.dim = mv, .family = "matrix"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
