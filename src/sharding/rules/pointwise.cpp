// Elementwise ops. Output dim d can be sharded when every input either shards its matching dim
// (aligned from the right, as broadcasting aligns them) or is broadcast along it (then Replicate).
// Linear ops also keep Partial: a sum of Partial(sum) tensors, or one scaled by a Replicate factor,
// is the Partial of the sums / scaled contributions.

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include "../registry.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

enum class Linearity {
  None,         // Partial inputs must be reduced first
  Additive,     // every tensor input may be Partial: f(sum x_r, sum y_r) = sum f(x_r, y_r)
  Scaling,      // any one tensor input may be Partial while the others are Replicate: x * y
  FirstLinear,  // only the first input may be Partial: x / y, and backward ops linear in the gradient
};

// x + 2 is affine, not linear: over Partial(sum) every rank but one must add 0 instead of 2 (see
// number_on_one_rank). Averages need nothing: the mean of x_r + 2 is X + 2.
std::optional<size_t> added_number(const OpSchema& s) {
  for (size_t i = 0; i < s.schema.arguments().size(); ++i)
    if (s.schema.arguments()[i].name() == "other" && (s.args[i].isDouble() || s.args[i].isInt())) return i;
  return std::nullopt;
}

// For x + number with a Partial(sum) output: only the rank at coordinate 0 of every Partial(sum)
// mesh dim adds the number, so the contributions still sum to X + number.
LocalArgs number_on_one_rank(const OpSchema& s, const PlacementStrategy& chosen) {
  const auto arg = added_number(s);
  if (!arg || !s.mesh->coordinate()) return {};
  const Shape& coordinate = *s.mesh->coordinate();
  for (size_t m = 0; m < coordinate.size(); ++m) {
    const Placement& p = chosen.outputs[0][m];
    if (p.is_partial() && p.reduce_op() == ReduceOp::Sum && coordinate[m] != 0)
      return {{*arg, s.args[*arg].isInt() ? c10::IValue(int64_t{0}) : c10::IValue(0.0)}};
  }
  return {};
}

// div with a rounding mode ("floor", "trunc") rounds each contribution on its own: floor(0.75 / 3)
// summed over 4 ranks is 0, not floor(3 / 3) = 1. Only true division is linear in its dividend.
bool rounds(const OpSchema& s) {
  const auto index = s.schema.argumentIndexWithName("rounding_mode");
  return index && !s.args[*index].isNone();
}

void add_partial_strategies(const OpSchema& s, Linearity linearity, std::vector<DimStrategy>& strategies);

// An out= argument (written, keyword-only; registry.h) takes the output's placement in every
// strategy: it receives the result, it is not an operand (a Partial out with Replicate operands would
// hold the whole result on every rank).
bool is_out_argument(const OpSchema& s, size_t input) { return detail::is_out_argument(s.schema, s.inputs[input].arg); }

void place_out_arguments(const OpSchema& s, std::vector<DimStrategy>& strategies) {
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (is_out_argument(s, i))
      for (auto& st : strategies) st.inputs[i] = st.outputs[0];
}

std::vector<DimStrategy> pointwise(const OpSchema& s, Linearity linearity) {
  const Shape& out = s.outputs.at(0).shape;
  const auto out_ndim = static_cast<int64_t>(out.size());
  std::vector<DimStrategy> strategies = {all_replicate(s)};
  for (int64_t d = 0; d < out_ndim; ++d) {
    DimStrategy st{Placements(s.outputs.size(), Shard(d)), {}};
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      const Shape& in = s.input(i).meta.shape;
      const int64_t id = d - (out_ndim - static_cast<int64_t>(in.size()));
      st.inputs.push_back(id >= 0 && in[id] == out[d] ? Shard(id) : Replicate());
    }
    strategies.push_back(std::move(st));
  }
  if (linearity != Linearity::None && !rounds(s)) add_partial_strategies(s, linearity, strategies);
  place_out_arguments(s, strategies);
  return strategies;
}

// Strategies that keep Partial inputs Partial, as far as the op is linear in them.
void add_partial_strategies(const OpSchema& s, Linearity linearity, std::vector<DimStrategy>& strategies) {
  for (auto op : linear_reduce_ops(s)) {
    const Placement p = Partial(op);
    if (linearity == Linearity::Additive) {
      strategies.push_back(DimStrategy{Placements(s.outputs.size(), p), Placements(s.inputs.size(), p)});
      continue;
    }
    const size_t candidates = linearity == Linearity::Scaling ? s.inputs.size() : std::min<size_t>(1, s.inputs.size());
    for (size_t partial_input = 0; partial_input < candidates; ++partial_input) {
      if (is_out_argument(s, partial_input)) continue;
      DimStrategy st{Placements(s.outputs.size(), p), Placements(s.inputs.size(), Replicate())};
      st.inputs[partial_input] = p;
      strategies.push_back(std::move(st));
    }
  }
}

// Output metas without running the op at full size (many elementwise ops have no Meta kernel): the
// shape is the inputs' broadcast shape; the dtype comes from the op on stand-ins whose dims are all 1
// (same ranks, so type promotion sees them as it sees the real inputs).
std::vector<TensorMeta> pointwise_metas(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  torch::jit::Stack stack;
  std::vector<int64_t> shape;
  for (const auto& v : args) {
    if (!v.isTensor() || !v.toTensor().defined()) {
      stack.push_back(v);
      continue;
    }
    const at::Tensor& t = v.toTensor();
    shape = at::infer_size(shape, t.sizes());
    stack.push_back(at::zeros(std::vector<int64_t>(t.dim(), 1), at::TensorOptions().dtype(t.scalar_type())));
  }
  op.callBoxed(stack);
  std::vector<TensorMeta> out;
  for (const auto& v : stack)
    if (v.isTensor()) out.push_back(TensorMeta{shape, contiguous_strides(shape), v.toTensor().scalar_type()});
  return out;
}

detail::OpRule rule(Linearity linearity) {
  return {.dim = [linearity](const OpSchema& s) { return pointwise(s, linearity); },
          .local_args = linearity == Linearity::Additive ? LocalArgsRule(number_on_one_rank) : LocalArgsRule(),
          .output_metas = pointwise_metas,
          .family = "pointwise",
          .strided_shards = detail::StridedShards::IndexWise};
}

const bool pointwise_rules_registered = [] {
  using detail::register_family;
  register_family({"aten::add", "aten::sub", "aten::rsub", "aten::neg", "aten::clone", "aten::positive"},
                  rule(Linearity::Additive));
  // Composite ops that training-IR graphs keep whole: Hugging Face attention ends in .contiguous(), its
  // norms cast with .to(dtype). (every_strategy_test checks them.)
  auto composite = [](detail::OpRule r) {
    r.family = "composite";
    return r;
  };
  detail::register_composite({"aten::contiguous"}, composite(rule(Linearity::Additive)));
  detail::register_composite({"aten::to.dtype", "aten::to.dtype_layout", "aten::to.device"}, composite(rule(Linearity::None)));
  register_family({"aten::mul"}, rule(Linearity::Scaling));
  // out= forms of the arithmetic ops (written outputs keep their placements).
  detail::register_overloads({"aten::add.out", "aten::sub.out"}, rule(Linearity::Additive));
  detail::register_overloads({"aten::mul.out"}, rule(Linearity::Scaling));
  detail::register_overloads({"aten::div.out", "aten::div.out_mode"}, rule(Linearity::FirstLinear));
  // AdamW with amsgrad keeps its running maximum with torch::max_out.
  detail::register_overloads({"aten::maximum.out", "aten::minimum.out"}, rule(Linearity::None));
  // attention's math path with a mask (_safe_softmax) writes where's result into a preallocated output
  detail::register_overloads({"aten::where.self_out"}, rule(Linearity::None));
  register_family({"aten::div", "aten::threshold_backward", "aten::sigmoid_backward", "aten::tanh_backward",
                   "aten::gelu_backward", "aten::silu_backward", "aten::hardtanh_backward",
                   "aten::leaky_relu_backward", "aten::elu_backward", "aten::softplus_backward",
                   "aten::hardsigmoid_backward", "aten::hardswish_backward", "aten::logit_backward",
                   "aten::mish_backward", "aten::hardshrink_backward", "aten::softshrink_backward"},
                  rule(Linearity::FirstLinear));
  register_family(
      {"aten::abs",        "aten::acos",       "aten::acosh",         "aten::asin",         "aten::asinh",
       "aten::atan",       "aten::atanh",      "aten::atan2",         "aten::ceil",         "aten::clamp",
       "aten::clamp_min",  "aten::clamp_max",  "aten::cos",           "aten::cosh",         "aten::erf",
       "aten::erfc",       "aten::erfinv",     "aten::exp",           "aten::exp2",         "aten::expm1",
       "aten::floor",      "aten::frac",       "aten::gelu",          "aten::hardtanh",     "aten::leaky_relu",
       "aten::lerp",       "aten::log",        "aten::log10",         "aten::log1p",        "aten::log2",
       "aten::logical_and", "aten::logical_not", "aten::logical_or",  "aten::logical_xor",  "aten::maximum",
       "aten::minimum",    "aten::pow",        "aten::reciprocal",    "aten::relu",         "aten::round",
       "aten::rsqrt",      "aten::sigmoid",    "aten::sign",          "aten::silu",         "aten::sin",
       "aten::sinh",       "aten::sqrt",       "aten::square",        "aten::tan",          "aten::tanh",
       "aten::trunc",      "aten::where",      "aten::eq",            "aten::ne",           "aten::lt",
       "aten::le",         "aten::gt",         "aten::ge",            "aten::masked_fill",  "aten::isnan",
       "aten::isinf",      "aten::isneginf",   "aten::isposinf",      "aten::nan_to_num", "aten::bitwise_and",   "aten::bitwise_or",   "aten::bitwise_xor",
       "aten::bitwise_not", "aten::fmod",      "aten::remainder",     "aten::addcmul",      "aten::addcdiv",
       "aten::elu",        "aten::softplus",   "aten::threshold",     "aten::_to_copy",   "aten::fill",       "aten::zero",          "aten::copy",         "aten::logit",
       "aten::mish",       "aten::hardswish",  "aten::hardsigmoid",   "aten::xlogy",        "aten::sgn",
       "aten::floor_divide", "aten::hypot",    "aten::copysign",      "aten::fmax",         "aten::fmin",
       "aten::lgamma",     "aten::mvlgamma",   "aten::digamma",    "aten::sinc",          "aten::logaddexp",    "aten::logaddexp2",
       "aten::heaviside",  "aten::signbit",    "aten::nextafter",     "aten::deg2rad",      "aten::rad2deg",
       "aten::i0",         "aten::bitwise_left_shift", "aten::bitwise_right_shift", "aten::relu6",
       "aten::polygamma",  "aten::special_i1", "aten::special_i0e", "aten::special_i1e",
       "aten::angle",      "aten::celu",       "aten::conj_physical", "aten::gcd",          "aten::lcm",
       "aten::hardshrink", "aten::softshrink", "aten::igamma",        "aten::igammac",      "aten::ldexp",
       "aten::frexp",      "aten::__lshift__",    "aten::__rshift__",   "aten::__ilshift__",
       "aten::__irshift__", "aten::special_airy_ai", "aten::special_bessel_j0", "aten::special_bessel_j1",
       "aten::special_bessel_y0", "aten::special_bessel_y1", "aten::special_entr", "aten::special_erfcx",
       "aten::special_log_ndtr", "aten::special_ndtri", "aten::special_modified_bessel_i0",
       "aten::special_modified_bessel_i1", "aten::special_modified_bessel_k0", "aten::special_modified_bessel_k1",
       "aten::special_scaled_modified_bessel_k0", "aten::special_scaled_modified_bessel_k1",
       "aten::special_spherical_bessel_j0", "aten::special_xlog1py", "aten::special_zeta",
       "aten::special_chebyshev_polynomial_t", "aten::special_chebyshev_polynomial_u",
       "aten::special_chebyshev_polynomial_v", "aten::special_chebyshev_polynomial_w",
       "aten::special_shifted_chebyshev_polynomial_t", "aten::special_shifted_chebyshev_polynomial_u",
       "aten::special_shifted_chebyshev_polynomial_v", "aten::special_shifted_chebyshev_polynomial_w",
       "aten::special_hermite_polynomial_h", "aten::special_hermite_polynomial_he",
       "aten::special_laguerre_polynomial_l", "aten::special_legendre_polynomial_p"},
      rule(Linearity::None));
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
