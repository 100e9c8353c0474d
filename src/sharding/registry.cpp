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
};

Registry& registry() {
  static Registry r;
  return r;
}

void route_to_dtensor(Registry& r, const c10::OperatorName& name, const std::string& qualified) {
  if (!r.kernels.insert(qualified).second) return;
  const auto sep = name.name.find("::");
  const std::string ns = name.name.substr(0, sep);
  auto& library = r.libraries[ns];
  if (!library)
    library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse2, __FILE__, __LINE__);
  const std::string local = name.name.substr(sep + 2) + (name.overload_name.empty() ? "" : "." + name.overload_name);
  if (!register_fast_kernel(*library, qualified))
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

// out= forms (out, grad_input, values, ...) write an argument after self; they are left to explicit
// registration, as each needs its own op-db sample.
bool writes_an_output_argument(const c10::OperatorHandle& op) {
  const auto& args = op.schema().arguments();
  for (size_t i = 1; i < args.size(); ++i)
    if (args[i].alias_info() && args[i].alias_info()->isWrite()) return true;
  return false;
}

void register_one(const std::string& qualified, const OpRule& rule, bool route = true) {
  const auto dot = qualified.find('.', qualified.find("::"));
  const std::string name = qualified.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : qualified.substr(dot + 1);
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
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

std::string qualified_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

std::shared_ptr<const OpRule> find_rule(const c10::OperatorHandle& op) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.rules.find(qualified_name(op.operator_name()));
  return it == r.rules.end() ? nullptr : it->second;
}

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
}  // namespace

}  // namespace dtensor::detail

namespace dtensor {

void register_dim_rule(const std::string& op, DimRule rule) { detail::register_one(op, detail::OpRule{std::move(rule), {}}); }
void register_mesh_rule(const std::string& op, MeshRule rule) { detail::register_one(op, detail::OpRule{{}, std::move(rule)}); }

bool has_sharding_rule(const std::string& op) {
  auto& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.rules.count(op) > 0;
}

std::string sharding_rule_family(const std::string& op) {
  auto& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.rules.find(op);
  return it == r.rules.end() ? "" : it->second->family;
}

std::vector<std::string> ops_with_sharding_rules() {
  auto& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& [name, rule] : r.rules) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace dtensor
