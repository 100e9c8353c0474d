// Samples for the batched linear algebra family: batches of 5 (uneven over 4 ranks) 3x3 matrices,
// well conditioned (diagonally dominant; symmetric positive definite where the op needs it), with
// right-hand sides of 2 columns; factorizations feed the solves that take them, as callers chain them.
// One solve broadcasts an unbatched matrix over the batch.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

// Input i: a diagonally dominant matrix (or, for other shapes, plain values).
at::Tensor dominant(size_t i, const Shape& shape) {
  at::Tensor t = test_tensor(shape, at::kDouble, 900 + i) / 8;
  if (shape.size() >= 2 && shape[shape.size() - 1] == shape[shape.size() - 2]) t = t + 2 * at::eye(shape.back(), at::kDouble);
  return t;
}

at::Tensor spd(const at::Tensor& a) { return a.matmul(a.mT()); }
at::Tensor symmetric(const at::Tensor& a) { return a + a.mT(); }

const Shape kMatrices = {5, 3, 3}, kRhs = {5, 3, 2}, kVectors = {5, 3};

OpSample sample(const std::string& name, std::vector<Shape> shapes, std::function<std::vector<at::Tensor>(In)> run) {
  return {.name = name, .shapes = std::move(shapes), .run = std::move(run), .make_input = dominant, .rtol = 1e-6, .atol = 1e-9};
}

OpSample without_gradient(OpSample s, const std::string& why) {
  s.backward = false;
  s.no_backward_reason = why;
  return s;
}

const bool linalg_samples_registered = add_op_samples({
    sample("linalg_cholesky_ex", {kMatrices}, [](In x) {
      auto [l, info] = at::linalg_cholesky_ex(spd(x[0]));
      return outputs(l, info);
    }),
    // Composites: the factorization, then _linalg_check_errors on its info (every rank checks it whole).
    sample("linalg_inv", {kMatrices}, [](In x) { return outputs(at::linalg_inv(x[0])); }),
    sample("linalg_cholesky", {kMatrices}, [](In x) { return outputs(at::linalg_cholesky(spd(x[0]))); }),
    sample("linalg_cross", {{5, 3, 4}, {5, 3, 4}}, [](In x) { return outputs(at::linalg_cross(x[0], x[1], 1)); }),
    sample("linalg_cross_broadcast", {{5, 3}, {1, 3}}, [](In x) { return outputs(at::linalg_cross(x[0], x[1])); }),
    sample("linalg_inv_ex", {kMatrices}, [](In x) {
      auto [inverse, info] = at::linalg_inv_ex(x[0]);
      return outputs(inverse, info);
    }),
    sample("_linalg_det", {kMatrices}, [](In x) {
      auto [det, lu, pivots] = at::_linalg_det(x[0]);
      return outputs(det, lu, pivots);
    }),
    sample("_linalg_slogdet", {kMatrices}, [](In x) {
      auto [sign, logabsdet, lu, pivots] = at::_linalg_slogdet(x[0]);
      return outputs(sign, logabsdet, lu, pivots);
    }),
    sample("_linalg_eigh", {kMatrices}, [](In x) {
      auto [values, vectors] = at::_linalg_eigh(symmetric(x[0]));
      return outputs(values, vectors);
    }),
    sample("_linalg_svd", {kMatrices}, [](In x) {
      auto [u, s, vh] = at::_linalg_svd(x[0]);
      return outputs(u, s, vh);
    }),
    sample("linalg_qr", {kMatrices}, [](In x) {
      auto [q, r] = at::linalg_qr(x[0]);
      return outputs(q, r);
    }),
    sample("linalg_lu", {kMatrices}, [](In x) {
      auto [p, l, u] = at::linalg_lu(x[0]);
      return outputs(p, l, u);
    }),
    sample("linalg_lu_factor_ex", {kMatrices}, [](In x) {
      auto [lu, pivots, info] = at::linalg_lu_factor_ex(x[0]);
      return outputs(lu, pivots, info);
    }),
    sample("linalg_eig", {kMatrices}, [](In x) { return outputs(at::real(std::get<0>(at::linalg_eig(symmetric(x[0]))))); }),
    without_gradient(sample("geqrf", {kMatrices},
                            [](In x) {
                              auto [a, tau] = at::geqrf(x[0]);
                              return outputs(a, tau);
                            }),
                     "LibTorch has no derivative for geqrf"),
    // LibTorch's derivative writes in place (tril_, fill_) to gradients laid out like the inputs: with
    // batch-sharded or Replicate inputs it runs (the gradient sample); other layouts are refused clearly.
    without_gradient(
        sample("linalg_householder_product", {kMatrices, kVectors}, [](In x) { return outputs(at::linalg_householder_product(x[0], x[1])); }),
        "its derivative writes in place to gradients laid out like the inputs: checked by linalg_householder_product_batch"),
    [] {
      OpSample s = sample("linalg_householder_product_batch", {kMatrices, kVectors},
                          [](In x) { return outputs(at::linalg_householder_product(x[0], x[1])); });
      s.placements = {{Replicate(), Shard(0)}, {Replicate(), Shard(0)}};
      s.partial_inputs = false;
      return s;
    }(),
    without_gradient(sample("linalg_matrix_exp", {kMatrices}, [](In x) { return outputs(at::linalg_matrix_exp(x[0] / 4)); }),
                     "LibTorch's derivative copies the DTensor into a plain block matrix, which dtensor refuses"),
    sample("_linalg_solve_ex", {kMatrices, kRhs}, [](In x) {
      auto [result, lu, pivots, info] = at::_linalg_solve_ex(x[0], x[1]);
      return outputs(result, lu, pivots, info);
    }),
    sample("_linalg_solve_ex_vectors", {kMatrices, kVectors}, [](In x) { return outputs(std::get<0>(at::_linalg_solve_ex(x[0], x[1]))); }),
    sample("cholesky_inverse", {kMatrices}, [](In x) { return outputs(at::cholesky_inverse(at::linalg_cholesky(spd(x[0])))); }),
    sample("triangular_solve", {kRhs, kMatrices}, [](In x) {
      auto [solution, coefficient] = at::triangular_solve(x[0], x[1]);
      return outputs(solution, coefficient);
    }),
    sample("cholesky_solve", {kRhs, kMatrices}, [](In x) { return outputs(at::cholesky_solve(x[0], at::linalg_cholesky(spd(x[1])))); }),
    sample("linalg_solve_triangular", {kMatrices, kRhs}, [](In x) { return outputs(at::linalg_solve_triangular(x[0], x[1], false)); }),
    sample("linalg_solve_triangular_broadcast", {{3, 3}, kRhs}, [](In x) { return outputs(at::linalg_solve_triangular(x[0], x[1], true)); }),
    sample("linalg_lu_solve", {kMatrices, kRhs}, [](In x) {
      auto [lu, pivots] = at::linalg_lu_factor(x[0]);
      return outputs(at::linalg_lu_solve(lu, pivots, x[1]));
    }),
    sample("lu_unpack", {kMatrices}, [](In x) {
      auto [lu, pivots] = at::linalg_lu_factor(x[0]);
      auto [p, l, u] = at::lu_unpack(lu, pivots);
      return outputs(p, l, u);
    }),
    without_gradient(sample("linalg_ldl_factor_ex", {kMatrices},
                            [](In x) {
                              auto [ld, pivots, info] = at::linalg_ldl_factor_ex(symmetric(x[0]));
                              return outputs(ld, pivots, info);
                            }),
                     "LibTorch has no derivative for the LDL factorization"),
    without_gradient(sample("linalg_ldl_solve", {kMatrices, kRhs},
                            [](In x) {
                              auto [ld, pivots, info] = at::linalg_ldl_factor_ex(symmetric(x[0]));
                              return outputs(at::linalg_ldl_solve(ld, pivots, x[1]));
                            }),
                     "LibTorch has no derivative for the LDL solve"),
});

}  // namespace
}  // namespace dtensor::testing
