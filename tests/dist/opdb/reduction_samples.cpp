// Samples for the reduction family: [5, 6] and [2, 5, 6] inputs (5 is uneven over 4 ranks, leaving
// one shard empty), reductions over one dim, a list of dims, all dims, with and without keepdim.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

// Boolean inputs for all / any: mostly true, so that all() is not trivially false everywhere.
at::Tensor mostly_true(size_t i, const Shape& shape) { return test_tensor(shape, at::kDouble, 300 + i) > -6; }

// Distinct values (7k mod n, a permutation when 7 does not divide n), so that sort and topk have one
// right answer, whatever the algorithm does with ties.
at::Tensor distinct(size_t, const Shape& shape) {
  const int64_t n = numel(shape);
  return at::arange(n, at::kDouble).mul(7).remainder(n).sub(n / 2).view(shape);
}

// Strictly positive inputs for prod (no zeros: their gradient would need a data-dependent path).
at::Tensor positive(size_t i, const Shape& shape) { return test_tensor(shape, at::kDouble, 400 + i).abs() / 4 + 0.5; }

// For equal: the first input, and the same values with one element changed (on one rank only, so
// that the answer needs every rank's).
at::Tensor all_but_one_alike(size_t i, const Shape& shape) {
  at::Tensor t = test_tensor(shape, at::kDouble, 500);
  if (i == 1) t.view(-1)[numel(shape) - 1] += 1;
  return t;
}

const bool reduction_samples_registered = add_op_samples({
    {"sum", {{5, 3}}, [](In x) { return outputs(x[0].sum()); }, nullptr, {}, true, true},
    {"sum_dim", {{5, 3}}, [](In x) { return outputs(x[0].sum(1)); }},
    {"sum_dim_keepdim", {{2, 5, 3}}, [](In x) { return outputs(x[0].sum({0, 2}, true)); }},
    {"nansum", {{5, 6}}, [](In x) { return outputs(at::nansum(x[0], {1})); }},
    {.name = "linalg__powsum", .shapes = {{5, 6}}, .run = [](In x) { return outputs(at::linalg__powsum(x[0], 3)); },
     .backward = false, .no_backward_reason = "LibTorch has no derivative for linalg__powsum"},
    {.name = "linalg__powsum_dim", .shapes = {{5, 6}},
     .run = [](In x) { return outputs(at::linalg__powsum(x[0], 2, std::vector<int64_t>{1}, true)); }, .backward = false,
     .no_backward_reason = "LibTorch has no derivative for linalg__powsum"},
    {"mean", {{5, 6}}, [](In x) { return outputs(x[0].mean()); }, nullptr, {}, true, true},
    {"mean_dim", {{5, 6}}, [](In x) { return outputs(x[0].mean(0)); }},
    {"mean_dims_keepdim", {{2, 5, 6}}, [](In x) { return outputs(x[0].mean({1, 2}, true)); }, nullptr, {}, true, true},
    {"prod", {{5, 3}}, [](In x) { return outputs(x[0].prod()); }, positive, {}, false, false, 1e-7, 1e-9, "", {},
     "autograd's formula for prod() on a tensor that is not subclass-like (a C++ DTensor) asks for nonzero(), whose "
     "output shape depends on the data"},
    {"prod_dim_keepdim", {{5, 6}}, [](In x) { return outputs(x[0].prod(1, true)); }, positive},
    {"max", {{5, 6}}, [](In x) { return outputs(x[0].max()); }},
    {"min", {{2, 5, 6}}, [](In x) { return outputs(x[0].min()); }},
    {"max_dim", {{5, 6}},
     [](In x) {
       auto [values, indices] = x[0].max(1);
       return outputs(values, indices);
     }},
    {"min_dim_keepdim", {{2, 5, 6}},
     [](In x) {
       auto [values, indices] = x[0].min(0, true);
       return outputs(values, indices);
     }},
    {"max_dim_out", {{5, 6}},
     [](In x) {
       auto [values, indices] = x[0].max(0);
       at::max_out(values, indices, x[0], 0);
       return outputs(values, indices);
     },
     nullptr, {}, false},
    {"min_dim_out", {{5, 6}},
     [](In x) {
       auto [values, indices] = x[0].min(1, true);
       at::min_out(values, indices, x[0], 1, true);
       return outputs(values, indices);
     },
     nullptr, {}, false},
    {"amax", {{2, 5, 6}}, [](In x) { return outputs(x[0].amax({0, 2})); }},
    {"amax_all", {{5, 6}}, [](In x) { return outputs(x[0].amax()); }},
    {"amin_keepdim", {{5, 6}}, [](In x) { return outputs(x[0].amin(1, true)); }},
    {"argmax", {{5, 6}}, [](In x) { return outputs(x[0].argmax(1)); }},
    {"argmax_flat", {{5, 6}}, [](In x) { return outputs(x[0].argmax()); }},
    {"argmin_keepdim", {{2, 5, 6}}, [](In x) { return outputs(x[0].argmin(0, true)); }},
    {"var", {{5, 6}}, [](In x) { return outputs(x[0].var(1)); }},
    {"var_correction_keepdim", {{2, 5, 6}},
     [](In x) { return outputs(at::var(x[0], at::IntArrayRef{0, 2}, /*correction=*/0, /*keepdim=*/true)); }},
    {"std", {{5, 6}}, [](In x) { return outputs(x[0].std()); }},
    {"std_dim", {{2, 5, 6}}, [](In x) { return outputs(x[0].std(1)); }},
    {"var_mean", {{5, 6}},
     [](In x) {
       auto [var, mean] = at::var_mean(x[0], at::IntArrayRef{0});
       return outputs(var, mean);
     }},
    {"std_mean", {{2, 5, 6}},
     [](In x) {
       auto [std, mean] = at::std_mean(x[0], at::IntArrayRef{1, 2}, /*correction=*/2, /*keepdim=*/true);
       return outputs(std, mean);
     }},
    {"vector_norm", {{5, 6}}, [](In x) { return outputs(at::linalg_vector_norm(x[0])); }},
    {"vector_norm_1", {{5, 6}}, [](In x) { return outputs(at::linalg_vector_norm(x[0], 1, at::IntArrayRef{1})); }},
    {"vector_norm_3_keepdim", {{2, 5, 6}},
     [](In x) { return outputs(at::linalg_vector_norm(x[0], 3, at::IntArrayRef{1, 2}, true)); }},
    {"vector_norm_inf", {{2, 5, 6}},
     [](In x) { return outputs(at::linalg_vector_norm(x[0], INFINITY, at::IntArrayRef{0, 2})); }},
    {"vector_norm_minus_inf", {{5, 6}},
     [](In x) { return outputs(at::linalg_vector_norm(x[0], -INFINITY, at::IntArrayRef{0})); }},
    {"vector_norm_inf_all", {{5, 3}}, [](In x) { return outputs(at::linalg_vector_norm(x[0], INFINITY)); }},
    {"vector_norm_0", {{5, 6}}, [](In x) { return outputs(at::linalg_vector_norm(x[0], 0)); }},
    {"norm", {{5, 6}}, [](In x) { return outputs(x[0].norm()); }},
    {"norm_dim", {{2, 5, 6}}, [](In x) { return outputs(x[0].norm(1, {1}, true)); }},
    {"logsumexp", {{5, 6}}, [](In x) { return outputs(x[0].logsumexp(1)); }},
    {"logsumexp_keepdim", {{2, 5, 6}}, [](In x) { return outputs(x[0].logsumexp({0, 2}, true)); }},
    {"all", {{5, 6}}, [](In x) { return outputs(x[0].all()); }, mostly_true},
    {"all_dim", {{5, 6}}, [](In x) { return outputs(x[0].all(1)); }, mostly_true},
    {"all_dims_keepdim", {{2, 5, 6}}, [](In x) { return outputs(at::all(x[0], at::IntArrayRef{0, 2}, true)); }, mostly_true},
    {"all_no_dims", {{5, 6}}, [](In x) { return outputs(at::all(x[0], at::IntArrayRef{})); }, mostly_true},
    {"any", {{5, 6}}, [](In x) { return outputs(x[0].any()); }, mostly_true},
    {"any_dim", {{5, 6}}, [](In x) { return outputs(x[0].any(0)); }, mostly_true},
    {"any_dims", {{2, 5, 6}}, [](In x) { return outputs(at::any(x[0], at::IntArrayRef{1, 2})); }, mostly_true},
    {"cumsum", {{5, 6}}, [](In x) { return outputs(x[0].cumsum(1)); }},
    // in place, the scanned dim cannot be resharded: only the placements that keep it whole
    {"cumsum_", {{2, 5, 6}}, [](In x) { return outputs(x[0].clone().cumsum_(0)); }, nullptr,
     {{Replicate(), Shard(1), Shard(2)}}},
    // Orderings: stable, so that equal values come out in one order whatever the shard.
    {"sort_stable", {{5, 6}},
     [](In x) {
       auto [values, indices] = x[0].sort(/*stable=*/true, 1, /*descending=*/true);
       return outputs(values, indices);
     }},
    {"sort", {{2, 5, 6}},
     [](In x) {
       auto [values, indices] = at::sort(x[0], 0);
       return outputs(values, indices);
     },
     distinct},
    {"topk", {{5, 6, 3}},
     [](In x) {
       auto [values, indices] = x[0].topk(3, 1);
       return outputs(values, indices);
     },
     distinct, {}, true, /*two_d=*/true},
    {"flip", {{2, 5, 6}}, [](In x) { return outputs(x[0].flip({0, 2})); }},
    // equal(self, other): the answers (one equal pair, one differing in one element) weigh the output.
    {.name = "equal",
     .shapes = {{5, 6}, {5, 6}},
     .run = [](In x) { return outputs(x[0] * (at::equal(x[0], x[0].clone()) ? 1.0 : 2.0) + (at::equal(x[0], x[1]) ? 10.0 : 0.0)); },
     .make_input = all_but_one_alike,
     .two_d = true},
    // Scans that are not sums, and selections along a dim: the dim stays whole.
    {"cumprod", {{5, 6}}, [](In x) { return outputs(x[0].cumprod(1)); }, positive},
    {"cumprod_", {{2, 5, 6}}, [](In x) { return outputs(x[0].clone().cumprod_(0)); }, positive,
     {{Replicate(), Shard(1), Shard(2)}}},
    {"cummax", {{5, 6}},
     [](In x) {
       auto [values, indices] = x[0].cummax(1);
       return outputs(values, indices);
     },
     distinct},
    {"cummin", {{2, 5, 6}},
     [](In x) {
       auto [values, indices] = x[0].cummin(0);
       return outputs(values, indices);
     },
     distinct},
    {"logcumsumexp", {{5, 6}}, [](In x) { return outputs(x[0].logcumsumexp(0)); }},
    {"kthvalue", {{5, 6}},
     [](In x) {
       auto [values, indices] = x[0].kthvalue(2, 1);
       return outputs(values, indices);
     },
     distinct},
    {"median", {{5, 6}}, [](In x) { return outputs(x[0].median()); }, distinct},
    {"median_dim", {{2, 5, 6}},
     [](In x) {
       auto [values, indices] = x[0].median(1, true);
       return outputs(values, indices);
     },
     distinct},
    {"nanmedian", {{5, 6}}, [](In x) { return outputs(x[0].nanmedian()); }, distinct},
    {"nanmedian_dim", {{5, 6}},
     [](In x) {
       auto [values, indices] = x[0].nanmedian(0);
       return outputs(values, indices);
     },
     distinct},
    {"mode", {{5, 6}},
     [](In x) {
       auto [values, indices] = (x[0].remainder(3)).mode(1);
       return outputs(values, indices);
     }},
});

}  // namespace
}  // namespace dtensor::testing
