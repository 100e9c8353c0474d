// Samples for every op in the pointwise family, built from each op's schema: tensor arguments get
// [5, 3] inputs (uneven over 4 ranks) or a broadcast [3] one, "mask"/"condition" arguments boolean
// tensors, other arguments their schema default or a plain value. In-place forms run on a clone.

#include <ATen/core/dispatch/Dispatcher.h>

#include "../op_db.h"
#include "dtensor/sharding.h"

namespace dtensor::testing {
namespace {

bool is_bool_arg(const c10::Argument& a) { return a.name() == "mask" || a.name() == "condition"; }

// A stand-in value for a non-tensor argument.
c10::IValue value_for(const c10::Argument& a) {
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

struct Call {
  c10::OperatorHandle op;
  bool writes;  // in-place or out=: the written arguments are clones, and there is no backward
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
      stack.push_back(value_for(a));
    }
  }
  c.op.callBoxed(stack);
  if (c.writes) return written;
  std::vector<at::Tensor> out;
  for (const auto& v : stack)
    if (v.isTensor()) out.push_back(v.toTensor());
  return out;
}

// Whether autograd can differentiate the call on one device (some ops, e.g. copy, cannot).
bool has_derivative(const Call& c, std::vector<at::Tensor> inputs) {
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

// Builds the sample, choosing input dtypes the single-device op accepts (double, then int64).
std::optional<OpSample> sample_for(const c10::OperatorName& name) {
  auto op = c10::Dispatcher::singleton().findOp(name);
  if (!op) return std::nullopt;
  bool writes = false;
  for (const auto& a : op->schema().arguments()) writes |= is_written(a);
  const Call c{*op, writes};
  std::vector<bool> boolean, zero_dim;  // per tensor argument
  for (const auto& a : op->schema().arguments())
    if (a.type()->kind() == c10::TypeKind::TensorType ||
        (a.type()->kind() == c10::TypeKind::OptionalType && a.type()->containedType(0)->kind() == c10::TypeKind::TensorType)) {
      boolean.push_back(is_bool_arg(a));
      zero_dim.push_back(a.name() == "value");  // fill.Tensor, masked_fill.Tensor take a 0-d value
    }
  for (auto dtype : {at::kDouble, at::kLong}) {
    OpSample s;
    s.name = name.name.substr(6) + (name.overload_name.empty() ? "" : "_" + name.overload_name);
    for (size_t i = 0; i < boolean.size(); ++i)
      s.shapes.push_back(zero_dim[i] ? Shape{} : i == 1 && !c.writes ? Shape{3} : Shape{5, 3});
    s.make_input = [boolean, dtype](size_t i, const Shape& shape) {
      at::Tensor t = test_tensor(shape, at::kDouble, 200 + i);
      return boolean[i] ? t > 0 : t.to(dtype);
    };
    s.run = [c](const std::vector<at::Tensor>& in) { return call(c, in); };
    // The gradient of a 0-d fill value sums the filled elements through masked_select, whose output
    // size depends on the data (no sharding rule can give it): gradients for the other inputs only.
    for (bool z : zero_dim) s.differentiable.push_back(!z);
    s.backward = !c.writes && dtype == at::kDouble;
    std::vector<at::Tensor> probe;
    for (size_t i = 0; i < s.shapes.size(); ++i) probe.push_back(s.make_input(i, s.shapes[i]));
    try {
      call(c, probe);
    } catch (const std::exception&) {
      continue;  // this dtype is not accepted; try the next
    }
    s.backward = s.backward && has_derivative(c, probe);
    return s;
  }
  return std::nullopt;
}

const bool registered = [] {
  std::vector<OpSample> samples;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const std::string qualified = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    if (sharding_rule_family(qualified) != "pointwise") continue;
    if (auto s = sample_for(name)) samples.push_back(std::move(*s));
  }
  return add_op_samples(std::move(samples));
}();

}  // namespace
}  // namespace dtensor::testing
