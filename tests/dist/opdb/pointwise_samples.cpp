// Samples for every op in the pointwise family, built from each op's schema: tensor arguments get
// [5, 3] inputs (uneven over 4 ranks) or a broadcast [3] one, "mask"/"condition" arguments boolean
// tensors, other arguments their schema default or a plain value. Arguments that change what the op
// computes get every value (rounding_mode None / "trunc" / "floor", gelu's approximate), and inputs
// lie inside each op's domain (acos of a number in (-1, 1), log of a positive one, a divisor that is
// not 0). In-place forms run on a clone, so their gradients reach the inputs too.

#include <ATen/core/dispatch/Dispatcher.h>

#include <map>

#include "../op_db.h"
#include "dtensor/sharding.h"

namespace dtensor::testing {
namespace {

bool is_bool_arg(const c10::Argument& a) { return a.name() == "mask" || a.name() == "condition"; }

// Values of string arguments that change what the op computes; one sample per value.
const std::map<std::string, std::vector<c10::IValue>> kVariants = {
    {"rounding_mode", {c10::IValue(), c10::IValue("trunc"), c10::IValue("floor")}},
    {"approximate", {c10::IValue("none"), c10::IValue("tanh")}},
};

// A stand-in value for a non-tensor argument (`variant`: the value for a kVariants argument).
c10::IValue value_for(const c10::Argument& a, const c10::IValue& variant) {
  if (kVariants.count(a.name())) return variant;
  // clamp needs a bound; integer numbers suit integer ops (bitwise_and.Scalar) and floating ones alike.
  if (a.name() == "min") return c10::IValue(int64_t{-2});
  if (a.name() == "max") return c10::IValue(int64_t{3});
  if (a.default_value()) return *a.default_value();
  switch (a.type()->kind()) {
    case c10::TypeKind::NumberType: return c10::IValue(int64_t{2});
    case c10::TypeKind::BoolType: return c10::IValue(false);
    case c10::TypeKind::IntType: return c10::IValue(int64_t{1});
    case c10::TypeKind::FloatType: return c10::IValue(0.5);
    default: return c10::IValue();
  }
}

// Inputs inside the op's domain, from integer-valued x in [-8, 8] (kept integral for integer dtypes).
enum class Domain { Any, Unit, AboveOne, Positive, OpenUnit, NonZero };

Domain domain_of(const std::string& op, size_t input) {
  static const std::map<std::string, Domain> first = {
      {"acos", Domain::Unit},      {"asin", Domain::Unit},       {"atanh", Domain::Unit},
      {"erfinv", Domain::Unit},    {"acosh", Domain::AboveOne},  {"log", Domain::Positive},
      {"log2", Domain::Positive},  {"log10", Domain::Positive},  {"log1p", Domain::Positive},
      {"sqrt", Domain::Positive},  {"rsqrt", Domain::Positive},  {"lgamma", Domain::Positive},  {"mvlgamma", Domain::Positive},
      {"digamma", Domain::Positive}, {"reciprocal", Domain::NonZero}, {"pow", Domain::Positive},
      {"logit", Domain::OpenUnit},   {"igamma", Domain::Positive},
      {"igammac", Domain::Positive}, {"special_ndtri", Domain::OpenUnit}, {"special_zeta", Domain::AboveOne},
      {"special_entr", Domain::Positive}, {"special_bessel_y0", Domain::Positive}, {"special_bessel_y1", Domain::Positive},
      {"special_modified_bessel_k0", Domain::Positive}, {"special_modified_bessel_k1", Domain::Positive},
      {"special_scaled_modified_bessel_k0", Domain::Positive}, {"special_scaled_modified_bessel_k1", Domain::Positive}};
  // The second tensor argument: a divisor, or xlogy's y, or logit_backward's input.
  static const std::map<std::string, Domain> second = {
      {"div", Domain::NonZero},       {"floor_divide", Domain::NonZero}, {"fmod", Domain::NonZero},
      {"remainder", Domain::NonZero}, {"xlogy", Domain::Positive},       {"logit_backward", Domain::OpenUnit},
      {"igamma", Domain::Positive},   {"igammac", Domain::Positive},     {"special_zeta", Domain::Positive},
      {"special_xlog1py", Domain::Positive}};
  const auto& table = input == 0 ? first : second;
  const auto it = table.find(op);
  return input <= 1 && it != table.end() ? it->second : Domain::Any;
}

at::Tensor in_domain(at::Tensor x, Domain d) {
  const bool integral = at::isIntegralType(x.scalar_type(), /*includeBool=*/true);
  switch (d) {
    case Domain::Any: return x;
    case Domain::Unit: return integral ? x.clamp(0, 0) : x / 10;
    case Domain::AboveOne: return x.abs() + (integral ? 2 : 1.5);
    case Domain::Positive: return x.abs() + (integral ? 1 : 0.5);
    case Domain::OpenUnit: return integral ? x.clamp(1, 1) : (x.abs() + 1) / 10;
    case Domain::NonZero: return at::where(x == 0, at::full_like(x, 3), x);
  }
  return x;
}

struct Call {
  c10::OperatorHandle op;
  bool writes;  // in-place or out=: the written arguments are clones
  c10::IValue variant;
};

bool is_written(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }

std::vector<at::Tensor> call(const Call& c, const std::vector<at::Tensor>& inputs) {
  const auto& args = c.op.schema().arguments();
  torch::jit::Stack stack;
  size_t next = 0;
  std::vector<at::Tensor> written;
  for (const auto& a : args) {
    if (a.type()->kind() == c10::TypeKind::TensorType ||
        (a.type()->kind() == c10::TypeKind::OptionalType && a.type()->containedType(0)->kind() == c10::TypeKind::TensorType)) {
      at::Tensor t = inputs[next++];
      if (is_written(a)) written.push_back(t = t.clone());
      stack.push_back(t);
    } else {
      stack.push_back(value_for(a, c.variant));
    }
  }
  c.op.callBoxed(stack);
  if (c.writes) return written;
  std::vector<at::Tensor> out;
  for (const auto& v : stack)
    if (v.isTensor()) out.push_back(v.toTensor());
  return out;
}

// Whether single-device autograd differentiates the call.
bool differentiates(const Call& c, std::vector<at::Tensor> inputs) {
  for (auto& t : inputs)
    if (at::isFloatingType(t.scalar_type())) t = t.clone().requires_grad_();
  try {
    for (auto& out : call(c, inputs))
      if (out.requires_grad()) out.sum().backward();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The kVariants argument of an op and its values; one None value when it has none.
std::pair<std::string, std::vector<c10::IValue>> variants_of(const c10::OperatorHandle& op) {
  for (const auto& a : op.schema().arguments()) {
    const auto it = kVariants.find(a.name());
    if (it != kVariants.end()) return {a.name(), it->second};
  }
  return {"", {c10::IValue()}};
}

std::string variant_suffix(const std::string& argument, const c10::IValue& value) {
  if (argument.empty()) return "";
  return "_" + (value.isNone() ? std::string("none") : value.toStringRef()) + "_" + argument;
}

// Builds the sample, choosing input dtypes the single-device op accepts (double, then int64).
// Ops whose LibTorch derivative makes a plain tensor and combines it with the input (a DTensor here),
// which dtensor refuses: their gradients cannot run on DTensors.
const std::map<std::string, std::string> kDerivativesWithPlainTensors = {
    {"mvlgamma", "LibTorch's derivative adds a plain arange to the input, which dtensor refuses to mix with DTensors"}};

std::optional<OpSample> sample_for(const c10::OperatorHandle& op, const c10::IValue& variant, const std::string& suffix) {
  const c10::OperatorName& name = op.operator_name();
  bool writes = false;
  for (const auto& a : op.schema().arguments()) writes |= is_written(a);
  const Call c{op, writes, variant};
  std::vector<bool> boolean, zero_dim;  // per tensor argument
  for (const auto& a : op.schema().arguments())
    if (a.type()->kind() == c10::TypeKind::TensorType ||
        (a.type()->kind() == c10::TypeKind::OptionalType && a.type()->containedType(0)->kind() == c10::TypeKind::TensorType)) {
      boolean.push_back(is_bool_arg(a));
      zero_dim.push_back(a.name() == "value");  // fill.Tensor, masked_fill.Tensor take a 0-d value
    }
  std::string base = name.name.substr(6);
  if (!base.empty() && base.back() == '_') base.pop_back();
  for (auto dtype : {at::kDouble, at::kLong}) {
    OpSample s;
    s.name = name.name.substr(6) + (name.overload_name.empty() ? "" : "_" + name.overload_name) + suffix;
    for (size_t i = 0; i < boolean.size(); ++i)
      s.shapes.push_back(zero_dim[i] ? Shape{} : i == 1 && !c.writes ? Shape{3} : Shape{5, 3});
    s.make_input = [boolean, dtype, base](size_t i, const Shape& shape) {
      at::Tensor t = test_tensor(shape, at::kDouble, 200 + i);
      return boolean[i] ? t > 0 : in_domain(t.to(dtype), domain_of(base, i));
    };
    s.run = [c](const std::vector<at::Tensor>& in) { return call(c, in); };
    // The gradient of a 0-d fill value sums the filled elements through masked_select, whose output
    // size depends on the data (no sharding rule can give it): gradients for the other inputs only.
    for (bool z : zero_dim) s.differentiable.push_back(!z);
    s.backward = dtype == at::kDouble;
    std::vector<at::Tensor> probe;
    for (size_t i = 0; i < s.shapes.size(); ++i) probe.push_back(s.make_input(i, s.shapes[i]));
    try {
      call(c, probe);
    } catch (const std::exception&) {
      continue;  // this dtype is not accepted; try the next
    }
    // Where single-device autograd cannot differentiate the call (out= forms, copy_ ...), gradients
    // are not compared; the coverage table says why.
    s.backward = s.backward && differentiates(c, probe);
    if (const auto plain = kDerivativesWithPlainTensors.find(base); plain != kDerivativesWithPlainTensors.end()) {
      s.backward = false;
      s.no_backward_reason = plain->second;
    }
    return s;
  }
  return std::nullopt;
}

const bool pointwise_samples_registered = [] {
  std::vector<OpSample> samples;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const std::string qualified = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    if (sharding_rule_family(qualified) != "pointwise") continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op) continue;
    const auto [argument, values] = variants_of(*op);
    for (const auto& value : values)
      if (auto s = sample_for(*op, value, variant_suffix(argument, value))) samples.push_back(std::move(*s));
  }
  return add_op_samples(std::move(samples));
}();

}  // namespace
}  // namespace dtensor::testing
