// Batched linear algebra (factorizations, inverses, solves, decompositions): each op works on the
// trailing matrix (or vector) dims of its tensors and treats every leading batch index on its own, so
// a batch dim can be sharded, the same batch dim of every tensor that has it (aligned from the right,
// as batch dims broadcast), while the matrix dims stay whole. A tensor broadcast along that batch dim
// (size 1, or without it) is Replicate. Nothing here is linear in Partial inputs: they are reduced first.

#include "../registry.h"
#include "optional_tensors.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

// How many trailing dims each tensor input and each output has per batch index: 2 for a matrix, 1 for
// a vector (pivots, tau, eigenvalues), 0 for a number (det, info).
struct CoreDims {
  std::vector<int64_t> inputs, outputs;
};

// Along the output's batch dim `b` (of `batch` batch dims, `size` long): the dim of a tensor of
// `shape` with `core` trailing dims that holds it, or nullopt when the tensor is broadcast along it.
// An output left empty by the op's flags (eigenvectors when not computed) has fewer dims than `core`.
std::optional<int64_t> batch_dim(const Shape& shape, int64_t core, int64_t batch, int64_t b, int64_t size) {
  const int64_t own_batch = static_cast<int64_t>(shape.size()) - core;
  const int64_t d = b - (batch - own_batch);
  if (own_batch < 0 || d < 0 || shape[d] != size) return std::nullopt;
  return d;
}

std::vector<DimStrategy> batch_strategies(const OpSchema& s, const CoreDims& core) {
  std::vector<DimStrategy> out = {all_replicate(s)};
  const int64_t batch = s.output_ndim(0) - core.outputs.at(0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t size = s.outputs[0].shape[b];
    auto placement = [&](const Shape& shape, int64_t c) {
      const auto d = batch_dim(shape, c, batch, b, size);
      return d ? Shard(*d) : Replicate();
    };
    DimStrategy st;
    for (size_t i = 0; i < s.inputs.size(); ++i) st.inputs.push_back(placement(s.input(i).meta.shape, core.inputs.at(i)));
    for (size_t k = 0; k < s.outputs.size(); ++k) st.outputs.push_back(placement(s.outputs[k].shape, core.outputs.at(k)));
    out.push_back(std::move(st));
  }
  return out;
}

detail::OpRule rule(CoreDims core) {
  return {.dim = [core = std::move(core)](const OpSchema& s) { return batch_strategies(s, core); }, .family = "linalg"};
}

// _linalg_solve_ex(A, B) -> (result, LU, pivots, info): B (and the result) is a batch of vectors when
// it is 1-d or has A's shape without its last dim, as torch.linalg.solve decides; of matrices otherwise.
std::vector<DimStrategy> solve_strategies(const OpSchema& s) {
  const Shape& a = s.input(0).meta.shape;
  const Shape& b = s.input(1).meta.shape;
  const bool vectors = b.size() == 1 || (b.size() + 1 == a.size() && std::equal(b.begin(), b.end(), a.begin()));
  const int64_t rhs = vectors ? 1 : 2;
  return batch_strategies(s, {{2, rhs}, {rhs, 2, 1, 0}});
}

// linalg_cross(self, other, dim): 3-vectors along `dim`, which stays whole; the other dims shard as in
// elementwise ops (broadcast inputs Replicate). Bilinear: one Partial input with the other Replicate
// gives the Partial of the products.
std::vector<DimStrategy> cross(const OpSchema& s) {
  const Shape& out = s.outputs[0].shape;
  const auto ndim = static_cast<int64_t>(out.size());
  const int64_t dim = wrap_dim(argument(s, "dim").toInt(), ndim);
  std::vector<DimStrategy> strategies = {all_replicate(s)};
  for (int64_t d = 0; d < ndim; ++d) {
    if (d == dim) continue;
    DimStrategy st{{Shard(d)}, {}};
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      const Shape& in = s.input(i).meta.shape;
      const int64_t id = d - (ndim - static_cast<int64_t>(in.size()));
      st.inputs.push_back(id >= 0 && in[id] == out[d] ? Shard(id) : Replicate());
    }
    strategies.push_back(std::move(st));
  }
  for (ReduceOp op : linear_reduce_ops(s))
    for (size_t partial = 0; partial < s.inputs.size(); ++partial) {
      DimStrategy st{{Partial(op)}, Placements(s.inputs.size(), Replicate())};
      st.inputs[partial] = Partial(op);
      strategies.push_back(std::move(st));
    }
  return strategies;
}

// _linalg_check_errors(info) raises when a factorization failed (info != 0). Every rank checks every
// batch element, so that all raise together rather than one alone while the others wait.
std::vector<DimStrategy> whole_info(const OpSchema& s) { return {all_replicate(s)}; }

const bool linalg_rules_registered = [] {
  using detail::register_family;
  const std::vector<std::pair<std::vector<std::string>, CoreDims>> ops = {
      {{"aten::linalg_cholesky_ex", "aten::linalg_inv_ex"}, {{2}, {2, 0}}},
      {{"aten::_linalg_det"}, {{2}, {0, 2, 1}}},
      {{"aten::_linalg_slogdet"}, {{2}, {0, 0, 2, 1}}},
      {{"aten::_linalg_eigh", "aten::linalg_eig"}, {{2}, {1, 2}}},
      {{"aten::_linalg_svd"}, {{2}, {2, 1, 2}}},
      {{"aten::linalg_qr"}, {{2}, {2, 2}}},
      {{"aten::linalg_lu"}, {{2}, {2, 2, 2}}},
      {{"aten::linalg_lu_factor_ex", "aten::linalg_ldl_factor_ex"}, {{2}, {2, 1, 0}}},
      {{"aten::geqrf"}, {{2}, {2, 1}}},
      {{"aten::linalg_matrix_exp"}, {{2}, {2}}},
      {{"aten::linalg_householder_product"}, {{2, 1}, {2}}},
      {{"aten::lu_unpack"}, {{2, 1}, {2, 2, 2}}},
      {{"aten::triangular_solve"}, {{2, 2}, {2, 2}}},
      {{"aten::cholesky_solve", "aten::linalg_solve_triangular"}, {{2, 2}, {2}}},
      {{"aten::linalg_lu_solve", "aten::linalg_ldl_solve"}, {{2, 1, 2}, {2}}},
  };
  for (const auto& [names, core] : ops) register_family(names, rule(core));
  detail::OpRule inverse = rule({{2}, {2}});
  inverse.output_metas = like_self;  // no Meta kernel, and stand-in zeros are singular
  register_family({"aten::cholesky_inverse"}, inverse);
  register_family({"aten::_linalg_solve_ex"}, {.dim = solve_strategies, .family = "linalg"});
  register_family({"aten::linalg_cross"}, {.dim = cross, .family = "linalg"});
  register_family({"aten::_linalg_check_errors"}, {.dim = whole_info, .family = "linalg"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
