#include "eager_graph_form.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "../mesh/collectives.h"
#include "../redistribute/executor.h"
#include "dtensor/errors.h"
#include "for_graph.h"

namespace dtensor::detail {
namespace {

thread_local bool forms_run_eagerly = false;
thread_local uint64_t calls_with_form = 0;

c10::OperatorHandle op_named(const std::string& qualified) {
  const auto handle = operator_named(qualified);
  if (!handle) throw DTensorError("graph form: no op " + qualified + " in the dispatcher");
  return *handle;
}

class EagerFormBuilder final : public GraphFormBuilder {
 public:
  EagerFormBuilder(const DeviceMesh& mesh, const c10::OperatorHandle& op, std::vector<c10::IValue> args)
      : mesh_(mesh), op_(op), args_(std::move(args)) {}

  FormValue input(size_t arg) override {
    if (arg >= args_.size() || !args_[arg].isTensor())
      throw DTensorError("graph form of " + op_.schema().name() + ": argument " + std::to_string(arg) + " is not a tensor");
    return hold(args_[arg].toTensor());
  }

  c10::IValue argument(size_t arg) override {
    if (arg >= args_.size()) throw DTensorError("graph form of " + op_.schema().name() + ": no argument " + std::to_string(arg));
    return args_[arg];
  }

  std::vector<FormValue> call(const std::string& qualified, std::vector<FormArg> args, const std::string&) override {
    const c10::OperatorHandle handle = op_named(qualified);
    const auto& schema = handle.schema().arguments();
    if (args.size() > schema.size()) throw DTensorError("graph form: " + qualified + " given too many arguments");
    torch::jit::Stack stack;
    for (const FormArg& a : args) stack.push_back(ivalue_of(a));
    for (size_t i = args.size(); i < schema.size(); ++i) {
      if (!schema[i].default_value()) throw DTensorError("graph form: " + qualified + " needs its argument " + schema[i].name());
      stack.push_back(*schema[i].default_value());
    }
    handle.callBoxed(stack);
    std::vector<FormValue> outputs;
    for (const c10::IValue& v : stack) outputs.push_back(hold(v.isNone() ? at::Tensor() : v.toTensor()));
    return outputs;
  }

  FormValue all_reduce(FormValue v, ReduceOp op, int64_t mesh_dim) override {
    at::Tensor t = value(v).clone();  // the form's values are never written
    all_reduce_over(mesh_, {mesh_dim}, t, op);
    return hold(t);
  }

  FormValue reshard(FormValue v, const TensorMeta& global, const Placements& from, const Placements& to) override {
    return hold(redistribute_local(value(v), DTensorSpec{mesh_.shared_from_this(), from, global}, to));
  }

  const at::Tensor& value(FormValue v) const {
    if (v.id < 0 || static_cast<size_t>(v.id) >= values_.size()) throw DTensorError("graph form: a value it was not given");
    return values_[v.id];
  }

 private:
  c10::IValue ivalue_of(const FormArg& a) const {
    if (a.value) return value(*a.value);
    if (a.call_argument) return args_.at(*a.call_argument);
    if (!a.is_list) return a.constant;
    std::vector<at::Tensor> list;
    for (FormValue v : a.values) list.push_back(value(v));
    return list;
  }

  FormValue hold(at::Tensor t) {
    values_.push_back(std::move(t));
    return FormValue{static_cast<int64_t>(values_.size()) - 1};
  }

  const DeviceMesh& mesh_;
  const c10::OperatorHandle& op_;
  std::vector<c10::IValue> args_;
  std::vector<at::Tensor> values_;
};

}  // namespace

void run_graph_form(const GraphForm& form, const DeviceMesh& mesh, const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  EagerFormBuilder builder(mesh, op, torch::jit::pop(stack, op.schema().arguments().size()));
  for (FormValue out : form(builder)) stack.emplace_back(builder.value(out));
}

void set_graph_forms_run_eagerly(bool on) { forms_run_eagerly = on; }
bool graph_forms_run_eagerly() { return forms_run_eagerly; }
uint64_t calls_with_a_graph_form() { return calls_with_form; }
void count_call_with_a_graph_form() { ++calls_with_form; }

}  // namespace dtensor::detail
