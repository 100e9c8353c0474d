#include "registry.h"

#include <torch/library.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "dispatch.h"
#include "fast_kernels.h"
#include "propagation.h"
#include "../tensor/as_dtensor.h"
#include "dtensor/errors.h"
#include "dtensor/sharding.h"

namespace dtensor::detail {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const OpRule>> rules;
  std::set<std::string> kernels;                               // ops whose PrivateUse2 kernel is ours
  std::map<std::string, std::unique_ptr<torch::Library>> libraries;  // one per namespace
  std::map<std::string, std::string> functional_forms;  // out= overload -> the functional one whose rule it shares
};

Registry& registry() {
  static Registry r;
  return r;
}

void route_to_dtensor(Registry& r, const c10::OperatorName& name, const std::string& qualified, bool composite_fallback = false) {
  if (!r.kernels.insert(qualified).second) return;
  const auto sep = name.name.find("::");
  const std::string ns = name.name.substr(0, sep);
  auto& library = r.libraries[ns];
  if (!library)
    library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse2, __FILE__, __LINE__);
  const std::string local = name.name.substr(sep + 2) + (name.overload_name.empty() ? "" : "." + name.overload_name);
  if (composite_fallback)
    library->impl(local.c_str(), torch::CppFunction::makeFromBoxedFunction<&composite_fallback_kernel>());
  else if (!register_fast_kernel(*library, qualified))
    library->impl(local.c_str(), torch::CppFunction::makeFromBoxedFunction<&dispatch_kernel>());
}

void add_rule(const c10::OperatorHandle& op, const OpRule& rule, bool route = true) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::string qualified = qualified_name(op.operator_name());
  const bool replaced = r.rules.count(qualified) > 0;
  r.rules[qualified] = std::make_shared<const OpRule>(rule);
  if (route) route_to_dtensor(r, op.operator_name(), qualified);
  // Decisions cached under the old rule are stale.
  if (replaced) invalidate_propagation_caches();
}

bool decomposes(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
         !op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
}

// out= forms (out, grad_input, values, ...): they share their functional form's rule (out_form).
bool writes_an_output_argument(const c10::OperatorHandle& op) { return has_out_arguments(op.schema()); }

void register_one(const std::string& qualified, const OpRule& rule, bool route = true) {
  auto op = operator_named(qualified);
  if (!op) throw DTensorError("cannot register a sharding rule for " + qualified + ": no such op in the dispatcher");
  add_rule(*op, rule, route);
}

}  // namespace

void register_overloads(const std::vector<std::string>& qualified_names, const OpRule& rule) {
  for (const auto& q : qualified_names) register_one(q, rule);
}

void register_composite(const std::vector<std::string>& qualified_names, const OpRule& rule) {
  for (const auto& q : qualified_names) register_one(q, rule, /*route=*/false);
}

bool is_out_argument(const c10::FunctionSchema& schema, size_t arg) {
  // Keyword-only: a written positional argument (_native_batch_norm_legit's running statistics,
  // rrelu_with_noise's noise) is an operand the op updates, not where its result goes.
  const c10::Argument& a = schema.arguments()[arg];
  return arg >= 1 && a.kwarg_only() && a.alias_info() != nullptr && a.alias_info()->isWrite();
}

bool has_out_arguments(const c10::FunctionSchema& schema) {
  for (size_t i = 1; i < schema.arguments().size(); ++i)
    if (is_out_argument(schema, i)) return true;
  return false;
}

std::string qualified_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

std::shared_ptr<const OpRule> find_rule(const c10::OperatorHandle& op) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.rules.find(qualified_name(op.operator_name()));
  return it == r.rules.end() ? nullptr : it->second;
}

bool has_sharding_rule(const c10::OperatorHandle& op) { return find_rule(op) != nullptr; }

std::optional<c10::OperatorHandle> operator_named(const std::string& qualified) {
  const auto sep = qualified.find("::");
  const auto dot = qualified.find('.', sep == std::string::npos ? 0 : sep);
  const std::string name = qualified.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : qualified.substr(dot + 1);
  return c10::Dispatcher::singleton().findSchema({name, overload});
}

namespace {

// The call as its functional form sees it: the same arguments, without the out tensors.
OpSchema without_out_arguments(const OpSchema& s) {
  OpSchema functional{s.schema, s.args, {}, s.outputs, s.mesh};
  for (const TensorInput& in : s.inputs)
    if (!is_out_argument(s.schema, in.arg)) functional.inputs.push_back(in);
  return functional;
}

// Which output each out tensor returns, by the alias sets of the schema.
size_t output_of(const c10::FunctionSchema& schema, size_t arg) {
  const auto* alias = schema.arguments()[arg].alias_info();
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    const auto* returned = schema.returns()[r].alias_info();
    if (returned && returned->beforeSets() == alias->beforeSets()) return r;
  }
  throw DTensorError(schema.name() + ": out argument " + schema.arguments()[arg].name() + " is not returned");
}

// The input placements of the out= call from its functional form's (one Placement per input for a
// single mesh dim, one Placements for the mesh): each out tensor placed as the output it returns
// (propagation keeps only strategies that leave it where it is).
template <typename T, typename OutputPlacement>
std::vector<T> with_out_inputs(const OpSchema& s, const std::vector<T>& functional, OutputPlacement output) {
  std::vector<T> inputs;
  size_t next = 0;
  for (const TensorInput& in : s.inputs)
    inputs.push_back(is_out_argument(s.schema, in.arg) ? output(output_of(s.schema, in.arg)) : functional.at(next++));
  return inputs;
}

// The chosen strategy as the functional form sees it: without the out tensors' placements.
PlacementStrategy without_out_inputs(const OpSchema& s, const PlacementStrategy& chosen) {
  PlacementStrategy functional = chosen;
  functional.inputs.clear();
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (!is_out_argument(s.schema, s.inputs[i].arg)) functional.inputs.push_back(chosen.inputs[i]);
  return functional;
}

// A functional local kernel run for an out= call: on the call's arguments without the out tensors,
// its results then copied into this rank's part of each out tensor, which the call returns.
LocalKernel into_out_tensors(const c10::FunctionSchema& schema, LocalKernel functional_kernel, c10::OperatorHandle functional) {
  // per argument: the return it is the out tensor of, or -1
  std::vector<int64_t> returned_as(schema.arguments().size(), -1);
  for (size_t i = 0; i < returned_as.size(); ++i)
    if (is_out_argument(schema, i)) returned_as[i] = static_cast<int64_t>(output_of(schema, i));
  return [functional_kernel = std::move(functional_kernel), functional, returned_as](const c10::OperatorHandle& op,
                                                                                      torch::jit::Stack& stack) {
    std::vector<c10::IValue> args = torch::jit::pop(stack, returned_as.size());
    std::vector<at::Tensor> out_of_return(op.schema().returns().size());
    for (size_t i = 0; i < args.size(); ++i) {
      if (returned_as[i] >= 0) out_of_return[static_cast<size_t>(returned_as[i])] = args[i].toTensor();
      else torch::jit::push(stack, std::move(args[i]));
    }
    functional_kernel(functional, stack);
    const auto results = torch::jit::pop(stack, functional.schema().returns().size());
    for (size_t r = 0; r < out_of_return.size(); ++r) {
      out_of_return[r].copy_(results.at(r).toTensor());
      torch::jit::push(stack, out_of_return[r]);
    }
  };
}

// out= overloads (add.out, sort.values, ...) share their functional form's rule, which sees the call
// without its out tensors. Where that rule computes the result with a local kernel of its own, the
// out= call runs that kernel and copies its results into the out tensors.
OpRule out_form(const OpRule& rule, const c10::OperatorHandle& functional) {
  OpRule out = rule;
  out.graph_form = {};  // graph programs are functional: out= overloads never reach a graph form
  if (rule.dim)
    out.dim = [dim = rule.dim](const OpSchema& s) {
      std::vector<DimStrategy> strategies = dim(without_out_arguments(s));
      for (DimStrategy& st : strategies) st.inputs = with_out_inputs(s, st.inputs, [&](size_t k) { return st.outputs.at(k); });
      return strategies;
    };
  if (rule.mesh)
    out.mesh = [mesh = rule.mesh](const OpSchema& s) {
      OpStrategy strategies = mesh(without_out_arguments(s));
      for (PlacementStrategy& st : strategies) {
        st.inputs = with_out_inputs(s, st.inputs, [&](size_t k) { return st.outputs.at(k); });
        st.redistribute_cost.clear();
      }
      return strategies;
    };
  if (rule.local_args)
    out.local_args = [local_args = rule.local_args](const OpSchema& s, const PlacementStrategy& chosen) {
      return local_args(without_out_arguments(s), without_out_inputs(s, chosen));
    };
  if (rule.local_kernel)
    out.local_kernel = [local_kernel = rule.local_kernel, functional](const OpSchema& s, const PlacementStrategy& chosen) {
      LocalKernel kernel = local_kernel(without_out_arguments(s), without_out_inputs(s, chosen));
      return kernel ? into_out_tensors(s.schema, std::move(kernel), functional) : LocalKernel{};
    };
  return out;
}

}  // namespace

void register_family(const std::vector<std::string>& names, const OpRule& rule) {
  std::set<std::string> wanted;
  for (const auto& n : names) {
    wanted.insert(n);
    wanted.insert(n + "_");
  }
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (!wanted.count(name.name)) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (op && !decomposes(*op) && !writes_an_output_argument(*op)) add_rule(*op, rule);
  }
}

namespace {
// Routes every op whose kernel would otherwise compute on a DTensor's (absent) storage — structured
// kernels registered for all backends (CompositeExplicitAutogradNonFunctional) — to dtensor's
// dispatch, so that an op without a rule fails with a clear error instead. Run before the first
// DTensor exists, when every library's ops are registered.
void route_storage_touching_ops() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (op && op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
      route_to_dtensor(r, name, qualified_name(name));
  }
}

[[maybe_unused]] const bool kRoutedBeforeTheFirstDTensor = (before_first_dtensor(&route_storage_touching_ops), true);

// Whether `functional` is the functional form of out= overload `out`: the same arguments, in order,
// without the out tensors, and nothing written.
bool functional_form_of(const c10::FunctionSchema& out, const c10::FunctionSchema& functional) {
  std::vector<const c10::Argument*> wanted;
  for (size_t i = 0; i < out.arguments().size(); ++i) {
    if (!is_out_argument(out, i)) wanted.push_back(&out.arguments()[i]);
    // out tensor lists (split_with_sizes_copy.out) would need one placement per element: not shared
    else if (out.arguments()[i].type()->kind() != c10::TypeKind::TensorType) return false;
  }
  if (functional.arguments().size() != wanted.size() || functional.is_mutable()) return false;
  for (size_t i = 0; i < wanted.size(); ++i)
    if (functional.arguments()[i].name() != wanted[i]->name() || functional.arguments()[i].type()->str() != wanted[i]->type()->str())
      return false;
  return true;
}

// Gives every out= overload without a rule its functional form's rule (out_form). Run once every
// rules file has registered (before the first DTensor, or when the registry is listed); rules
// registered later get no out= forms.
void register_out_forms() {
  std::map<std::string, std::vector<c10::OperatorHandle>> by_name;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames())
    if (auto op = c10::Dispatcher::singleton().findOp(name)) by_name[name.name].push_back(*op);
  for (const auto& [name, overloads] : by_name)
    for (const auto& out : overloads) {
      if (!writes_an_output_argument(out) || find_rule(out)) continue;
      for (const auto& functional : overloads) {
        const auto rule = find_rule(functional);
        if (!rule || decomposes(functional) || !functional_form_of(out.schema(), functional.schema())) continue;
        add_rule(out, out_form(*rule, functional));
        std::lock_guard<std::mutex> lock(registry().mutex);
        registry().functional_forms[qualified_name(out.operator_name())] = qualified_name(functional.operator_name());
        break;
      }
    }
}

void ensure_out_forms() {
  static std::once_flag once;
  std::call_once(once, register_out_forms);
}

[[maybe_unused]] const bool kOutFormsBeforeTheFirstDTensor = (before_first_dtensor(&ensure_out_forms), true);

// Ops whose only kernel is ATen's composite one (CompositeExplicitAutograd, no backend kernel of their
// own), that take a tensor and have no rule: the dispatcher would run that implementation on DTensors
// silently; routed to composite_fallback_kernel, it runs with CommDebugMode and the log told.
void route_composite_fallbacks() {
  using c10::DispatchKey;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || r.rules.count(qualified_name(name)) || !op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
        op->hasKernelForDispatchKey(DispatchKey::PrivateUse2) ||  // dtensor's own kernel (conj_views.cpp)
        op->hasKernelForDispatchKey(DispatchKey::CPU) || op->hasKernelForDispatchKey(DispatchKey::CUDA) ||
        op->hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd))
      continue;
    const auto& args = op->schema().arguments();
    if (std::any_of(args.begin(), args.end(), [](const c10::Argument& a) { return a.type()->kind() == c10::TypeKind::TensorType; }))
      route_to_dtensor(r, name, qualified_name(name), /*composite_fallback=*/true);
  }
}

[[maybe_unused]] const bool kCompositeFallbacksBeforeTheFirstDTensor = (before_first_dtensor(&route_composite_fallbacks), true);
}  // namespace

}  // namespace dtensor::detail

namespace dtensor {

void register_dim_rule(const std::string& op, DimRule rule) { detail::register_one(op, detail::OpRule{std::move(rule), {}}); }
void register_mesh_rule(const std::string& op, MeshRule rule) { detail::register_one(op, detail::OpRule{{}, std::move(rule)}); }

bool has_sharding_rule(const std::string& op) {
  detail::ensure_out_forms();
  auto& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.rules.count(op) > 0;
}

std::string sharding_rule_family(const std::string& op) {
  detail::ensure_out_forms();
  auto& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.rules.find(op);
  return it == r.rules.end() ? "" : it->second->family;
}

std::string functional_form_sharing_rule(const std::string& op) {
  detail::ensure_out_forms();
  auto& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.functional_forms.find(op);
  return it == r.functional_forms.end() ? "" : it->second;
}

std::vector<std::string> ops_with_sharding_rules() {
  detail::ensure_out_forms();
  auto& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& [name, rule] : r.rules) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace dtensor
