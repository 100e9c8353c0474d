// Samples for the _foreach_* family: lists of two tensors, [5, 3] and [7] (both uneven over 4 ranks),
// each element placed on its own (the one-list ops on the 2x2 mesh too); functional and in-place forms (in-place on clones, so gradients
// reach the inputs), with list, number, number-list and tensor operands. Values lie in (0.1, 0.9),
// inside every op's domain (log, acos, reciprocal, pow).

#include <array>
#include <limits>

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;
using List = std::vector<at::Tensor>;
using Functional = std::function<List(In)>;  // the op on the inputs, returning its result lists
using InPlace = std::function<void(List&, In)>;  // the op in place on a clone of the first list

const std::vector<Shape> kOneList = {{5, 3}, {7}};
const std::vector<Shape> kTwoLists = {{5, 3}, {7}, {5, 3}, {7}};
const std::vector<Shape> kThreeLists = {{5, 3}, {7}, {5, 3}, {7}, {5, 3}, {7}};

at::Tensor in_unit_interval(size_t i, const Shape& shape) { return test_tensor(shape, at::kDouble, 800 + i).sigmoid() * 0.8 + 0.1; }

List list(In x, size_t k) { return {x[2 * k], x[2 * k + 1]}; }
List cloned(In x) { return {x[0].clone(), x[1].clone()}; }

OpSample functional(const std::string& name, const std::vector<Shape>& shapes, Functional f) {
  return {.name = name, .shapes = shapes, .run = std::move(f), .make_input = in_unit_interval, .rtol = 1e-6, .atol = 1e-9};
}

// The op in place on a clone of the first list (x[0], x[1]), which it returns.
OpSample in_place(const std::string& name, const std::vector<Shape>& shapes, InPlace f) {
  return functional(name, shapes, [f = std::move(f)](In x) {
    List self = cloned(x);
    f(self, x);
    return self;
  });
}

// A sample pair per op: functional and in place.
void both(std::vector<OpSample>& out, const std::string& name, const std::vector<Shape>& shapes, Functional f, InPlace g) {
  out.push_back(functional(name, shapes, std::move(f)));
  out.push_back(in_place(name + "_", shapes, std::move(g)));
}

std::vector<OpSample> unary_samples() {
  std::vector<OpSample> out;
  using Op = List (*)(at::TensorList);
  using OpInPlace = void (*)(at::TensorList);
  const std::vector<std::tuple<std::string, Op, OpInPlace>> ops = {
      {"abs", at::_foreach_abs, at::_foreach_abs_},           {"acos", at::_foreach_acos, at::_foreach_acos_},
      {"asin", at::_foreach_asin, at::_foreach_asin_},        {"atan", at::_foreach_atan, at::_foreach_atan_},
      {"ceil", at::_foreach_ceil, at::_foreach_ceil_},        {"cos", at::_foreach_cos, at::_foreach_cos_},
      {"cosh", at::_foreach_cosh, at::_foreach_cosh_},        {"erf", at::_foreach_erf, at::_foreach_erf_},
      {"erfc", at::_foreach_erfc, at::_foreach_erfc_},        {"exp", at::_foreach_exp, at::_foreach_exp_},
      {"expm1", at::_foreach_expm1, at::_foreach_expm1_},     {"floor", at::_foreach_floor, at::_foreach_floor_},
      {"frac", at::_foreach_frac, at::_foreach_frac_},        {"lgamma", at::_foreach_lgamma, at::_foreach_lgamma_},
      {"log", at::_foreach_log, at::_foreach_log_},           {"log10", at::_foreach_log10, at::_foreach_log10_},
      {"log1p", at::_foreach_log1p, at::_foreach_log1p_},     {"log2", at::_foreach_log2, at::_foreach_log2_},
      {"neg", at::_foreach_neg, at::_foreach_neg_},           {"reciprocal", at::_foreach_reciprocal, at::_foreach_reciprocal_},
      {"round", at::_foreach_round, at::_foreach_round_},     {"rsqrt", at::_foreach_rsqrt, at::_foreach_rsqrt_},
      {"sigmoid", at::_foreach_sigmoid, at::_foreach_sigmoid_}, {"sign", at::_foreach_sign, at::_foreach_sign_},
      {"sin", at::_foreach_sin, at::_foreach_sin_},           {"sinh", at::_foreach_sinh, at::_foreach_sinh_},
      {"sqrt", at::_foreach_sqrt, at::_foreach_sqrt_},        {"tan", at::_foreach_tan, at::_foreach_tan_},
      {"tanh", at::_foreach_tanh, at::_foreach_tanh_},        {"trunc", at::_foreach_trunc, at::_foreach_trunc_},
      {"zero", at::_foreach_zero, at::_foreach_zero_}};
  for (const auto& [name, f, g] : ops)
    both(out, "_foreach_" + name, kOneList, [f](In x) { return f(list(x, 0)); }, [g](List& self, In) { g(self); });
  out[out.size() - 2].backward = false;
  out[out.size() - 2].no_backward_reason = "LibTorch has no derivative for the functional _foreach_zero";
  out.push_back(functional("_foreach_clone", kOneList, [](In x) { return at::_foreach_clone(list(x, 0)); }));
  OpSample powsum = functional("_foreach_powsum", kOneList, [](In x) { return at::_foreach_powsum(list(x, 0), 3); });
  powsum.backward = false;
  powsum.no_backward_reason = "LibTorch has no derivative for _foreach_powsum";
  out.push_back(std::move(powsum));
  for (auto& sample : out) sample.two_d = true;
  return out;
}

std::vector<OpSample> binary_samples() {
  std::vector<OpSample> out;
  const std::vector<at::Scalar> numbers = {0.5, 3};
  const at::Scalar two = 2, three_halves = 1.5;
  auto other = [](In x) { return list(x, 1); };
  // List operands.
  both(out, "_foreach_add_list", kTwoLists, [=](In x) { return at::_foreach_add(list(x, 0), other(x), two); },
       [=](List& s, In x) { at::_foreach_add_(s, other(x), two); });
  both(out, "_foreach_sub_list", kTwoLists, [=](In x) { return at::_foreach_sub(list(x, 0), other(x), two); },
       [=](List& s, In x) { at::_foreach_sub_(s, other(x), two); });
  both(out, "_foreach_mul_list", kTwoLists, [=](In x) { return at::_foreach_mul(list(x, 0), other(x)); },
       [=](List& s, In x) { at::_foreach_mul_(s, other(x)); });
  both(out, "_foreach_div_list", kTwoLists, [=](In x) { return at::_foreach_div(list(x, 0), other(x)); },
       [=](List& s, In x) { at::_foreach_div_(s, other(x)); });
  both(out, "_foreach_clamp_max_list", kTwoLists, [=](In x) { return at::_foreach_clamp_max(list(x, 0), other(x)); },
       [=](List& s, In x) { at::_foreach_clamp_max_(s, other(x)); });
  both(out, "_foreach_clamp_min_list", kTwoLists, [=](In x) { return at::_foreach_clamp_min(list(x, 0), other(x)); },
       [=](List& s, In x) { at::_foreach_clamp_min_(s, other(x)); });
  both(out, "_foreach_maximum_list", kTwoLists, [=](In x) { return at::_foreach_maximum(list(x, 0), other(x)); },
       [=](List& s, In x) { at::_foreach_maximum_(s, other(x)); });
  both(out, "_foreach_minimum_list", kTwoLists, [=](In x) { return at::_foreach_minimum(list(x, 0), other(x)); },
       [=](List& s, In x) { at::_foreach_minimum_(s, other(x)); });
  both(out, "_foreach_pow_list", kTwoLists, [=](In x) { return at::_foreach_pow(list(x, 0), other(x)); },
       [=](List& s, In x) { at::_foreach_pow_(s, other(x)); });
  both(out, "_foreach_lerp_scalar", kTwoLists, [=](In x) { return at::_foreach_lerp(list(x, 0), other(x), three_halves); },
       [=](List& s, In x) { at::_foreach_lerp_(s, other(x), three_halves); });
  both(out, "_foreach_lerp_scalar_list", kTwoLists, [=](In x) { return at::_foreach_lerp(list(x, 0), other(x), numbers); },
       [=](List& s, In x) { at::_foreach_lerp_(s, other(x), numbers); });
  // Number operands: one for all, or one per element.
  both(out, "_foreach_add_scalar", kOneList, [=](In x) { return at::_foreach_add(list(x, 0), two); },
       [=](List& s, In) { at::_foreach_add_(s, two); });
  both(out, "_foreach_add_scalar_list", kOneList, [=](In x) { return at::_foreach_add(list(x, 0), numbers); },
       [=](List& s, In) { at::_foreach_add_(s, numbers); });
  both(out, "_foreach_sub_scalar", kOneList, [=](In x) { return at::_foreach_sub(list(x, 0), two); },
       [=](List& s, In) { at::_foreach_sub_(s, two); });
  both(out, "_foreach_sub_scalar_list", kOneList, [=](In x) { return at::_foreach_sub(list(x, 0), numbers); },
       [=](List& s, In) { at::_foreach_sub_(s, numbers); });
  both(out, "_foreach_mul_scalar", kOneList, [=](In x) { return at::_foreach_mul(list(x, 0), two); },
       [=](List& s, In) { at::_foreach_mul_(s, two); });
  both(out, "_foreach_mul_scalar_list", kOneList, [=](In x) { return at::_foreach_mul(list(x, 0), numbers); },
       [=](List& s, In) { at::_foreach_mul_(s, numbers); });
  both(out, "_foreach_div_scalar", kOneList, [=](In x) { return at::_foreach_div(list(x, 0), two); },
       [=](List& s, In) { at::_foreach_div_(s, two); });
  both(out, "_foreach_div_scalar_list", kOneList, [=](In x) { return at::_foreach_div(list(x, 0), numbers); },
       [=](List& s, In) { at::_foreach_div_(s, numbers); });
  both(out, "_foreach_clamp_max_scalar", kOneList, [=](In x) { return at::_foreach_clamp_max(list(x, 0), three_halves); },
       [=](List& s, In) { at::_foreach_clamp_max_(s, three_halves); });
  both(out, "_foreach_clamp_max_scalar_list", kOneList, [=](In x) { return at::_foreach_clamp_max(list(x, 0), numbers); },
       [=](List& s, In) { at::_foreach_clamp_max_(s, numbers); });
  both(out, "_foreach_clamp_min_scalar", kOneList, [=](In x) { return at::_foreach_clamp_min(list(x, 0), three_halves); },
       [=](List& s, In) { at::_foreach_clamp_min_(s, three_halves); });
  both(out, "_foreach_clamp_min_scalar_list", kOneList, [=](In x) { return at::_foreach_clamp_min(list(x, 0), numbers); },
       [=](List& s, In) { at::_foreach_clamp_min_(s, numbers); });
  both(out, "_foreach_maximum_scalar", kOneList, [=](In x) { return at::_foreach_maximum(list(x, 0), three_halves); },
       [=](List& s, In) { at::_foreach_maximum_(s, three_halves); });
  both(out, "_foreach_maximum_scalar_list", kOneList, [=](In x) { return at::_foreach_maximum(list(x, 0), numbers); },
       [=](List& s, In) { at::_foreach_maximum_(s, numbers); });
  both(out, "_foreach_minimum_scalar", kOneList, [=](In x) { return at::_foreach_minimum(list(x, 0), three_halves); },
       [=](List& s, In) { at::_foreach_minimum_(s, three_halves); });
  both(out, "_foreach_minimum_scalar_list", kOneList, [=](In x) { return at::_foreach_minimum(list(x, 0), numbers); },
       [=](List& s, In) { at::_foreach_minimum_(s, numbers); });
  for (size_t k = out.size() - 7; k < out.size(); k += 2) {
    out[k].backward = false;
    out[k].no_backward_reason = "LibTorch has no derivative for in-place maximum/minimum with numbers";
  }
  both(out, "_foreach_pow_scalar", kOneList, [=](In x) { return at::_foreach_pow(list(x, 0), three_halves); },
       [=](List& s, In) { at::_foreach_pow_(s, three_halves); });
  both(out, "_foreach_pow_scalar_list", kOneList, [=](In x) { return at::_foreach_pow(list(x, 0), numbers); },
       [=](List& s, In) { at::_foreach_pow_(s, numbers); });
  out.push_back(functional("_foreach_pow_scalar_and_tensor", kOneList, [=](In x) { return at::_foreach_pow(three_halves, list(x, 0)); }));
  // A 0-d tensor operand, Replicate; LibTorch's derivative for it fails ("inconsistent range for
  // TensorList output") on one device too, so the gradients are those of the lists.
  const std::vector<Shape> with_tensor = {{5, 3}, {7}, {}};
  both(out, "_foreach_add_tensor", with_tensor, [=](In x) { return at::_foreach_add(list(x, 0), x[2], two); },
       [=](List& s, In x) { at::_foreach_add_(s, x[2], two); });
  both(out, "_foreach_mul_tensor", with_tensor, [=](In x) { return at::_foreach_mul(list(x, 0), x[2]); },
       [=](List& s, In x) { at::_foreach_mul_(s, x[2]); });
  both(out, "_foreach_div_tensor", with_tensor, [=](In x) { return at::_foreach_div(list(x, 0), x[2]); },
       [=](List& s, In x) { at::_foreach_div_(s, x[2]); });
  for (size_t k = out.size() - 6; k < out.size(); ++k) out[k].differentiable = {true, true, false};
  return out;
}

std::vector<OpSample> ternary_samples() {
  std::vector<OpSample> out;
  const std::vector<at::Scalar> numbers = {0.5, 3};
  const at::Scalar value = 0.75;
  auto t1 = [](In x) { return list(x, 1); };
  auto t2 = [](In x) { return list(x, 2); };
  both(out, "_foreach_addcmul_scalar", kThreeLists, [=](In x) { return at::_foreach_addcmul(list(x, 0), t1(x), t2(x), value); },
       [=](List& s, In x) { at::_foreach_addcmul_(s, t1(x), t2(x), value); });
  both(out, "_foreach_addcmul_scalar_list", kThreeLists,
       [=](In x) { return at::_foreach_addcmul(list(x, 0), t1(x), t2(x), numbers); },
       [=](List& s, In x) { at::_foreach_addcmul_(s, t1(x), t2(x), numbers); });
  both(out, "_foreach_addcdiv_scalar", kThreeLists, [=](In x) { return at::_foreach_addcdiv(list(x, 0), t1(x), t2(x), value); },
       [=](List& s, In x) { at::_foreach_addcdiv_(s, t1(x), t2(x), value); });
  both(out, "_foreach_addcdiv_scalar_list", kThreeLists,
       [=](In x) { return at::_foreach_addcdiv(list(x, 0), t1(x), t2(x), numbers); },
       [=](List& s, In x) { at::_foreach_addcdiv_(s, t1(x), t2(x), numbers); });
  both(out, "_foreach_lerp_list", kThreeLists, [=](In x) { return at::_foreach_lerp(list(x, 0), t1(x), t2(x)); },
       [=](List& s, In x) { at::_foreach_lerp_(s, t1(x), t2(x)); });
  std::vector<Shape> with_scalars = kThreeLists;
  with_scalars.push_back({2});
  // Per-element numbers as a 1-d tensor (one per element), Replicate; in place only (see foreach.cpp),
  // and LibTorch has no derivative for it.
  for (const bool mul : {true, false}) {
    OpSample sample = in_place(mul ? "_foreach_addcmul_tensor_" : "_foreach_addcdiv_tensor_", with_scalars, [=](List& s, In x) {
      if (mul) at::_foreach_addcmul_(s, t1(x), t2(x), x[6]);
      else at::_foreach_addcdiv_(s, t1(x), t2(x), x[6]);
    });
    sample.backward = false;
    sample.no_backward_reason = "LibTorch has no derivative for the in-place .Tensor form";
    out.push_back(std::move(sample));
  }
  // Three lists of two elements: each element R or S(0), not every dim, to keep the combinations few.
  for (auto& s : out) s.placements = std::vector<std::vector<Placement>>(s.shapes.size(), {Replicate(), Shard(0)});
  return out;
}

// The fused Adam and AdamW steps (amsgrad, so with max_exp_avg_sqs), lr a number or a 0-d tensor: the
// parameter list, the per-element step counts and lr are the inputs; gradients and moments are made
// from the parameters on the mesh, so each element's lists share its placements as an optimizer's do.
std::vector<OpSample> fused_adam_samples() {
  using State = std::array<List, 5>;  // params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs
  auto state = [](In x) {
    State out;
    for (const at::Tensor& p : list(x, 0)) {
      out[0].push_back(p.clone());
      out[1].push_back(p.sin());
      out[2].push_back(p.cos() / 10);
      out[3].push_back(p.square() + 0.01);
      out[4].push_back(p.square() * 1.5 + 0.01);
    }
    return out;
  };
  auto flat = [](const State& lists) {
    List out;
    for (const List& l : lists) out.insert(out.end(), l.begin(), l.end());
    return out;
  };
  // One step, functional or in place, Adam or AdamW, with lr given as `lr` (a double or a tensor).
  auto step = [=](In x, bool in_place, bool adamw, const auto& lr) {
    State s = state(x);
    const List steps = {x[2], x[3]};
    if (in_place) {
      if (adamw) at::_fused_adamw_(s[0], s[1], s[2], s[3], s[4], steps, lr, 0.9, 0.999, 0.1, 1e-8, true, false);
      else at::_fused_adam_(s[0], s[1], s[2], s[3], s[4], steps, lr, 0.9, 0.999, 0.1, 1e-8, true, false);
      return flat(s);
    }
    auto [p, g, m, v, vmax] = adamw ? at::_fused_adamw(s[0], s[1], s[2], s[3], s[4], steps, lr, 0.9, 0.999, 0.1, 1e-8, true, false)
                                    : at::_fused_adam(s[0], s[1], s[2], s[3], s[4], steps, lr, 0.9, 0.999, 0.1, 1e-8, true, false);
    return flat({p, g, m, v, vmax});
  };
  std::vector<OpSample> out;
  for (const bool adamw : {false, true})
    for (const bool in_place : {false, true}) {
      const std::string name = std::string(adamw ? "_fused_adamw" : "_fused_adam") + (in_place ? "_" : "");
      out.push_back(functional(name, {{5, 3}, {7}, {}, {}}, [=](In x) { return step(x, in_place, adamw, 0.01); }));
      out.push_back(functional(name + "_tensor_lr", {{5, 3}, {7}, {}, {}, {}}, [=](In x) { return step(x, in_place, adamw, x[4]); }));
    }
  for (auto& sample : out) {
    // Steps counted 3; lr 0.01.
    sample.make_input = [](size_t i, const Shape& shape) {
      return i < 2 ? in_unit_interval(i, shape) : at::full(shape, i == 4 ? 0.01 : 3.0, at::kDouble);
    };
    sample.backward = false;
    sample.no_backward_reason = "an optimizer step: LibTorch has no derivative for it";
  }
  return out;
}

// GradScaler's unscale: gradients [5, 3] and [7], found_inf and inv_scale [1]. Called on the gradients
// as they are (found_inf stays 0), then with one infinite element in the last row, which only one rank
// holds when rows are sharded: every rank must flag it.
OpSample unscale_sample() {
  const std::vector<Placement> rows_and_columns{Replicate(), Shard(0), Shard(1), Partial()}, rows{Replicate(), Shard(0), Partial()};
  return {.name = "_amp_foreach_non_finite_check_and_unscale_",
          .shapes = {{5, 3}, {7}, {1}, {1}},
          .run = [](In x) {
            List grads = {x[0].clone(), x[1].clone()};
            at::Tensor finite = x[2].clone(), overflowed = x[2].clone();
            at::_amp_foreach_non_finite_check_and_unscale_(grads, finite, x[3]);
            // A row of infinities under four of zeros (new tensors of shapes other than x[0]'s are Replicate).
            const at::Tensor last_row = at::cat({x[0].new_zeros({4, 3}), x[0].new_full({1, 3}, std::numeric_limits<float>::infinity())});
            List with_inf = {x[0] + last_row, x[1].clone()};
            at::_amp_foreach_non_finite_check_and_unscale_(with_inf, overflowed, x[3]);
            return List{grads[0], grads[1], finite, overflowed, with_inf[1]};
          },
          .make_input = [](size_t i, const Shape& shape) {
            // float32, as GradScaler keeps them (its CPU kernel takes no other scale)
            return (i < 2 ? in_unit_interval(i, shape) : at::full(shape, i == 2 ? 0.0 : 0.25, at::kDouble)).to(at::kFloat);
          },
          .placements = {rows_and_columns, rows, {Replicate()}, {Replicate()}},
          .backward = false,
          .two_d = true,
          .rtol = 1e-6,  // float32: a Partial gradient's contributions sum in another order
          .atol = 1e-7,
          .no_backward_reason = "GradScaler's step: LibTorch has no derivative for it",
          .partial_inputs = false};
}

const bool foreach_samples_registered = [] {
  add_op_samples(fused_adam_samples());
  add_op_samples({unscale_sample()});
  add_op_samples(unary_samples());
  add_op_samples(binary_samples());
  return add_op_samples(ternary_samples());
}();

}  // namespace
}  // namespace dtensor::testing
