#include "propagation.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "../redistribute/executor.h"
#include "../tensor/as_dtensor.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "dtensor/sharding.h"
#include "registry.h"

namespace dtensor::detail {
namespace {

// ---- the cache key ----------------------------------------------------------------------------

// Non-tensor arguments as a flat signature: numbers (Scalar) by kind only, everything else by value.
void append_signature(const c10::IValue& v, const c10::Argument& arg, std::vector<int64_t>& out) {
  // Tensors enter the key through their specs, in order; here every tensor argument still marks its
  // position (defined, undefined or None), so that (None, b) and (b, None) differ, and a tensor list
  // its length.
  if (v.isTensor()) {
    out.push_back(v.toTensor().defined() ? -5 : -4);
    return;
  }
  if (v.isTensorList()) {
    out.push_back(static_cast<int64_t>(v.toTensorList().size()));
    return;
  }
  if (arg.type()->kind() == c10::TypeKind::NumberType ||
      (arg.type()->kind() == c10::TypeKind::OptionalType &&
       arg.type()->containedType(0)->kind() == c10::TypeKind::NumberType)) {
    out.push_back(v.isNone() ? 0 : v.isDouble() ? 1 : v.isInt() ? 2 : v.isBool() ? 3 : 4);
    return;
  }
  if (v.isNone()) out.push_back(-1);
  else if (v.isInt()) out.push_back(v.toInt());
  else if (v.isBool()) out.push_back(v.toBool() ? 1 : 0);
  else if (v.isDouble()) {
    const double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    out.push_back(bits);
  } else if (v.isIntList()) {
    const auto list = v.toIntList();
    out.push_back(static_cast<int64_t>(list.size()));
    for (int64_t x : list) out.push_back(x);
  } else if (v.isString()) {
    out.push_back(static_cast<int64_t>(std::hash<std::string>()(v.toStringRef())));
  } else if (v.isDevice()) {
    out.push_back(static_cast<int64_t>(v.toDevice().type()));
  } else if (v.isGenerator()) {
    out.push_back(-3);  // which generator draws never changes how the op shards
  } else if (v.isList()) {
    const auto list = v.toListRef();
    out.push_back(static_cast<int64_t>(list.size()));
    for (const auto& x : list) {
      if (x.isTensor() || x.isNone()) out.push_back(x.isNone() ? -1 : -2);
      else out.push_back(static_cast<int64_t>(c10::IValue::hash(x)));
    }
  } else {
    out.push_back(static_cast<int64_t>(c10::IValue::hash(v)));
  }
}

// What the key holds of an input spec: everything but the mesh (the key holds the mesh's id), as
// numbers, so that a lookup compares one flat array instead of chasing each spec's vectors. Each
// placement holds only what Placement::operator== compares, so equal specs give equal numbers.
void append_spec(const DTensorSpec& s, std::vector<int64_t>& out) {
  out.push_back(static_cast<int64_t>(s.placements.size()));
  for (const Placement& p : s.placements) {
    out.push_back(static_cast<int64_t>(p.kind()));
    if (p.is_sharding()) out.push_back(p.dim());
    if (p.is_multi_run_shard()) out.push_back(p.split_factor());
    if (p.is_partial()) out.push_back(static_cast<int64_t>(p.reduce_op()));
  }
  out.push_back(static_cast<int64_t>(s.meta.dtype));
  out.push_back(static_cast<int64_t>(s.meta.shape.size()));
  out.insert(out.end(), s.meta.shape.begin(), s.meta.shape.end());
  out.push_back(static_cast<int64_t>(s.meta.stride.size()));
  out.insert(out.end(), s.meta.stride.begin(), s.meta.stride.end());
}

struct CacheEntry {
  std::vector<int64_t> key;  // op, mesh id (never reused: a destroyed mesh's entries never match), specs, signature
  CachedDecision cached;
};

// Bumped to invalidate every thread's cache (clear_propagation_cache, a rule registered again); each
// thread's cache notices on its next lookup.
std::atomic<uint64_t> g_generation{0};

struct Cache {
  std::unordered_multimap<size_t, CacheEntry> entries;
  PropagationCacheStats stats;
  uint64_t generation = 0;
};

Cache& cache() {
  thread_local Cache c;
  return c;
}

// ---- output metas: the op's own shape logic on the global shapes ------------------------------

// Stand-ins for the global tensors: Meta tensors (no data), with the op's device arguments the Meta
// device too (is_device_argument), where the op has a Meta kernel, else CPU
// tensors whose storage is one zero element expanded to the global shape (the op computes on them,
// which costs time and an output's memory, but only on a propagation-cache miss). An argument the op
// writes gets zeros of its own (DenseZero): a kernel without LibTorch's overlap check (rrelu_with_noise's)
// would write every element into the one zero, past its buffer.
enum class Proxy { Meta, ExpandedZero, DenseZero };

at::Tensor proxy_of(const at::Tensor& t, Proxy kind) {
  TensorMeta m{t.sizes().vec(), t.strides().vec(), t.scalar_type()};
  if (const DTensorImpl* impl = as_dtensor(t)) m = impl->spec().meta;
  if (kind == Proxy::Meta)
    return at::empty_strided(m.shape, m.stride, at::TensorOptions().dtype(m.dtype).device(at::kMeta));
  if (kind == Proxy::DenseZero) return at::zeros(m.shape, at::TensorOptions().dtype(m.dtype));
  return at::zeros({}, at::TensorOptions().dtype(m.dtype)).expand(m.shape);
}

c10::IValue proxy_of(const c10::IValue& v, Proxy kind) {
  if (v.isTensor()) return v.toTensor().defined() ? c10::IValue(proxy_of(v.toTensor(), kind)) : v;
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(proxy_of(t, kind));
    return out;
  }
  if (v.isList() && v.type<c10::Type>()->containedType(0)->kind() == c10::TypeKind::OptionalType) {
    c10::List<std::optional<at::Tensor>> out;
    for (const auto& x : v.toListRef())
      out.push_back(x.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(proxy_of(x.toTensor(), kind)));
    return out;
  }
  return v;
}

std::vector<TensorMeta> metas_of(const torch::jit::Stack& stack) {
  std::vector<TensorMeta> out;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) out.push_back(TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  };
  for (const auto& v : stack) {
    if (v.isTensor()) add(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) add(t);
  }
  return out;
}

// A device argument of the op (a factory's, as new_empty_strided's from AccumulateGrad), which would
// make its Meta run allocate the global result on that device.
bool is_device_argument(const c10::Argument& argument, const c10::IValue& value) {
  const c10::TypePtr& type = argument.type();
  const bool device = type->kind() == c10::TypeKind::DeviceObjType ||
                      (type->kind() == c10::TypeKind::OptionalType && type->containedType(0)->kind() == c10::TypeKind::DeviceObjType);
  return device && value.isDevice();
}

std::vector<TensorMeta> run_on_proxies(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, Proxy kind) {
  torch::jit::Stack stack;
  const auto& schema = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* alias = i < schema.size() ? schema[i].alias_info() : nullptr;
    const bool written = alias != nullptr && alias->isWrite();
    if (kind == Proxy::Meta && i < schema.size() && is_device_argument(schema[i], args[i])) stack.emplace_back(c10::Device(at::kMeta));
    else stack.push_back(proxy_of(args[i], kind == Proxy::ExpandedZero && written ? Proxy::DenseZero : kind));
  }
  op.callBoxed(stack);
  return metas_of(stack);
}

// The returned tensors when every one of them is an argument the op writes to (in-place, out=).
std::optional<std::vector<TensorMeta>> written_returns(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  torch::jit::Stack returned;
  for (const auto& r : schema.returns()) {
    const auto* alias = r.alias_info();
    if (!alias || !alias->isWrite()) return std::nullopt;
    for (size_t i = 0; i < args.size(); ++i) {
      const auto* a = schema.arguments()[i].alias_info();
      if (a && a->beforeSets() == alias->beforeSets()) returned.push_back(proxy_of(args[i], Proxy::Meta));
    }
  }
  return metas_of(returned);
}

// out= tensors must already have the result's shape: on one device the op would resize them, but a
// DTensor's local buffer cannot be resized to a global shape. The Meta kernel says the result's.
void check_out_shapes(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, const std::vector<TensorMeta>& given) {
  if (!has_out_arguments(op.schema())) return;
  std::vector<TensorMeta> result;
  try {
    result = run_on_proxies(op, args, Proxy::Meta);
  } catch (const c10::NotImplementedError&) {
    return;  // no Meta kernel: the local kernel's own checks stand
  }
  for (size_t k = 0; k < given.size() && k < result.size(); ++k)
    if (given[k].shape != result[k].shape)
      throw DTensorError("op " + qualified_name(op.operator_name()) + ": out tensor " + std::to_string(k) + " has shape " +
                         shape_str(given[k].shape) + " but the result's is " + shape_str(result[k].shape) +
                         "; DTensors do not resize out= tensors: pass one of the result's shape");
}

std::vector<TensorMeta> output_metas(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                     const OpRule& rule) {
  // An in-place view (t_, unsqueeze_) returns its argument reshaped: its Meta kernel says how.
  if (!op.hasTag(at::Tag::inplace_view))
    if (auto written = written_returns(op.schema(), args)) {
      check_out_shapes(op, args, *written);
      return *written;
    }
  try {
    return run_on_proxies(op, args, Proxy::Meta);
  } catch (const c10::NotImplementedError&) {
    // No Meta kernel: the rule's own shape logic, else compute on expanded zeros below.
  } catch (const std::exception& e) {
    throw DTensorError("op " + qualified_name(op.operator_name()) + " rejects the global shapes: " + e.what());
  }
  try {
    if (rule.output_metas) return rule.output_metas(op, args);
    return run_on_proxies(op, args, Proxy::ExpandedZero);
  } catch (const std::exception& e) {
    throw DTensorError("op " + qualified_name(op.operator_name()) + " failed on the global shapes: " + e.what());
  }
}

// ---- strategies -----------------------------------------------------------------------------------

OpStrategy expand_over_mesh(const std::vector<DimStrategy>& per_dim, int64_t mesh_ndim, size_t n_out, size_t n_in) {
  OpStrategy out = {PlacementStrategy{std::vector<Placements>(n_out), std::vector<Placements>(n_in), {}}};
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    OpStrategy next;
    next.reserve(out.size() * per_dim.size());
    for (const auto& partial : out)
      for (const auto& d : per_dim) {
        PlacementStrategy s = partial;
        for (size_t k = 0; k < n_out; ++k) s.outputs[k].push_back(d.outputs[k]);
        for (size_t k = 0; k < n_in; ++k) s.inputs[k].push_back(d.inputs[k]);
        s.kernel_cost += d.kernel_cost;
        next.push_back(std::move(s));
      }
    out = std::move(next);
  }
  return out;
}

struct WrittenInput {
  size_t input;
  std::optional<size_t> output;  // the output that returns it, if any
};

// Inputs an op writes to (in-place and out= ops) keep their local buffers, so their placements can
// change only in ways that keep the buffer: a Partial tensor reduced in place to Replicate (dispatch
// does that, when nothing else shares the buffer), and an in-place view (t_) whose result is the
// same buffer under the view's placements.
std::vector<WrittenInput> written_inputs(const c10::FunctionSchema& schema, const std::vector<TensorInput>& inputs) {
  std::vector<WrittenInput> out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto* alias = schema.arguments()[inputs[i].arg].alias_info();
    if (!alias || !alias->isWrite()) continue;
    WrittenInput w{i, std::nullopt};
    for (size_t r = 0; r < schema.returns().size(); ++r) {
      const auto* ra = schema.returns()[r].alias_info();
      if (ra && ra->beforeSets() == alias->beforeSets()) w.output = r;
    }
    out.push_back(w);
  }
  return out;
}

std::string describe_inputs(const OpSchema& s) {
  std::string out;
  for (size_t i = 0; i < s.inputs.size(); ++i)
    out += (i ? "; " : "") + std::string("input ") + std::to_string(i) + " " + shape_str(s.input(i).meta.shape) +
           " (" + to_string(s.input(i).placements) + ")";
  return out;
}

// ---- strided shards (see StridedShards in registry.h) ----------------------------------------------

// The inputs with every StridedShard replaced by Replicate: what a rule that does not place strided
// shards is asked about.
std::vector<TensorInput> strided_as_replicate(const std::vector<TensorInput>& inputs) {
  std::vector<TensorInput> out = inputs;
  for (TensorInput& in : out) {
    if (!holds_strided(in.spec->placements)) continue;
    Placements p = in.spec->placements;
    for (Placement& x : p)
      if (x.is_multi_run_shard()) x = Replicate();
    in.spec = std::make_shared<const DTensorSpec>(in.spec->with_placements(std::move(p)));
  }
  return out;
}

// `st` with every Shard along mesh dim m made the strided `like` (of that Shard's dim), for an
// IndexWise rule: only when every tensor sharded there has `length` elements along its sharded dim, so
// that the one partition of one index runs through the whole op, and none is multi-run there already
// (cat's packed blocks: Shard pieces joined into a StridedShard, whose blocks would be runs of runs).
std::optional<PlacementStrategy> as_strided(PlacementStrategy st, const OpSchema& s, size_t m, int64_t length,
                                            const Placement& like) {
  auto convert = [&](Placements& placements, const Shape& shape) {
    Placement& p = placements[m];
    if (p.is_multi_run_shard()) return false;
    if (!p.is_shard()) return true;
    if (shape[p.dim()] != length) return false;
    p = like.with_dim(p.dim());
    return true;
  };
  for (size_t k = 0; k < st.inputs.size(); ++k)
    if (!convert(st.inputs[k], s.input(k).meta.shape)) return std::nullopt;
  for (size_t k = 0; k < st.outputs.size(); ++k)
    if (!convert(st.outputs[k], s.outputs[k].shape)) return std::nullopt;
  return st;
}

// For each strided input (head-tail ones only where `head_tail_only`), the strategies that shard its
// dim plainly along its mesh dim, offered with that dim strided (and again for further strided inputs,
// so that several can stay as they are).
void add_strided_variants(OpStrategy& all, const OpSchema& s, bool head_tail_only) {
  auto known = [&](const PlacementStrategy& v) {
    return std::any_of(all.begin(), all.end(),
                       [&](const PlacementStrategy& o) { return o.inputs == v.inputs && o.outputs == v.outputs; });
  };
  for (size_t k = 0; k < s.inputs.size(); ++k)
    for (size_t m = 0; m < s.input(k).placements.size(); ++m) {
      const Placement& p = s.input(k).placements[m];
      if (head_tail_only ? !p.is_head_tail_shard() : !p.is_multi_run_shard()) continue;
      const int64_t length = s.input(k).meta.shape[p.dim()];
      for (size_t i = 0, n = all.size(); i < n; ++i) {
        if (all[i].inputs[k][m] != Shard(p.dim())) continue;
        if (auto v = as_strided(all[i], s, m, length, p); v && !known(*v)) all.push_back(std::move(*v));
      }
    }
}

OpStrategy rule_strategies(const OpRule& rule, const OpSchema& schema, int64_t mesh_ndim) {
  if (rule.mesh) return rule.mesh(schema);
  return expand_over_mesh(rule.dim(schema), mesh_ndim, schema.outputs.size(), schema.inputs.size());
}

// The rule's strategies for the call: asked as it is where the rule places strided shards itself or
// there are none; otherwise asked with them as Replicate, plus the strided forms of its strategies
// where the rule is IndexWise.
OpStrategy strategies_for(const OpRule& rule, const OpSchema& schema, int64_t mesh_ndim) {
  const bool strided = std::any_of(schema.inputs.begin(), schema.inputs.end(),
                                   [](const TensorInput& in) { return holds_strided(in.spec->placements); });
  if (!strided || rule.strided_shards == StridedShards::Own) return rule_strategies(rule, schema, mesh_ndim);
  OpSchema asked = schema;
  asked.inputs = strided_as_replicate(schema.inputs);
  OpStrategy all = rule_strategies(rule, asked, mesh_ndim);
  if (rule.strided_shards == StridedShards::IndexWise || rule.strided_shards == StridedShards::HeadTailIndexWise)
    add_strided_variants(all, schema, rule.strided_shards == StridedShards::HeadTailIndexWise);
  return all;
}

// The call's schema (with its output metas) and every strategy of the op's rule that fits it: ranks
// match, and inputs the op writes to keep their placements (see written_inputs).
struct Candidates {
  std::shared_ptr<const OpRule> rule;
  OpSchema schema;
  OpStrategy strategies;
};

Candidates candidates_for(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                          const std::vector<TensorInput>& inputs, const MeshPtr& mesh) {
  Candidates c{find_rule(op), OpSchema{op.schema(), args, inputs, {}, mesh.get()}, {}};
  OpSchema& schema = c.schema;
  if (c.rule == nullptr)
    throw DTensorError("no sharding strategy for op " + qualified_name(op.operator_name()) + " (" + describe_inputs(schema) +
                       "). Ways out: redistribute the inputs to Replicate and run the op on to_local() results, or "
                       "register a strategy with dtensor::register_dim_rule");
  schema.outputs = output_metas(op, args, *c.rule);
  OpStrategy all = strategies_for(*c.rule, schema, mesh->ndim());
  const auto written = written_inputs(op.schema(), inputs);
  const bool inplace_view = op.hasTag(at::Tag::inplace_view);
  for (auto& st : all) {
    bool ok = st.outputs.size() == schema.outputs.size() && st.inputs.size() == inputs.size();
    for (size_t k = 0; ok && k < st.outputs.size(); ++k) ok = placements_fit(st.outputs[k], mesh->ndim(), schema.output_ndim(k));
    for (size_t k = 0; ok && k < st.inputs.size(); ++k) ok = placements_fit(st.inputs[k], mesh->ndim(), schema.input_ndim(k));
    for (const auto& w : written) {
      const Placements& current = schema.input(w.input).placements;
      ok = ok && (st.inputs[w.input] == current || st.inputs[w.input] == partial_as_replicate(current));
      ok = ok && (!w.output || inplace_view || st.outputs[*w.output] == st.inputs[w.input]);
    }
    if (ok) c.strategies.push_back(std::move(st));
  }
  return c;
}

OutputSharding decision_for(const Candidates& c, const PlacementStrategy& chosen) {
  OutputSharding decision;
  decision.chosen = chosen;
  for (size_t k = 0; k < c.schema.outputs.size(); ++k)
    decision.outputs.push_back(DTensorSpec{nullptr, chosen.outputs[k], c.schema.outputs[k]});
  for (size_t k = 0; k < c.schema.inputs.size(); ++k) {
    if (chosen.inputs[k] == c.schema.input(k).placements) decision.input_moves.emplace_back();
    else decision.input_moves.emplace_back(chosen.inputs[k]);
  }
  if (c.rule->local_args) decision.local_args = c.rule->local_args(c.schema, chosen);
  if (c.rule->local_kernel) decision.local_kernel = c.rule->local_kernel(c.schema, chosen);
  // Graph programs are functional: an op writing its arguments keeps its kernel (and is not saved).
  if (decision.local_kernel && c.rule->graph_form && !c.schema.schema.is_mutable())
    decision.graph_form = c.rule->graph_form(c.schema, chosen);
  return decision;
}

OutputSharding decide(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                      const std::vector<TensorInput>& inputs, const MeshPtr& mesh) {
  Candidates c = candidates_for(op, args, inputs, mesh);
  const PlacementStrategy* best = nullptr;
  std::pair<bool, double> best_cost{true, 0};
  for (auto& st : c.strategies) {
    st.redistribute_cost.clear();
    double moves = 0;
    for (size_t k = 0; k < inputs.size(); ++k) {
      st.redistribute_cost.push_back(redistribute_cost(c.schema.input(k), st.inputs[k]));
      moves += st.redistribute_cost.back();
    }
    // A strategy that moves no input wins first (the cheapest such kernel); otherwise the lowest total
    // of moves and the kernel's own communication.
    const std::pair<bool, double> cost{moves > 0, moves + st.kernel_cost};
    if (best == nullptr || cost < best_cost) {
      best = &st;
      best_cost = cost;
    }
  }
  if (best == nullptr) {
    const bool writes = !written_inputs(op.schema(), inputs).empty();
    throw DTensorError("op " + qualified_name(op.operator_name()) + " has no sharding strategy for " +
                       describe_inputs(c.schema) +
                       (writes ? " that keeps the placements of the tensor it writes to (in-place and "
                                 "out= ops cannot change them, beyond reducing a Partial one; use the "
                                 "out-of-place op)"
                               : "") +
                       ". Ways out: redistribute the inputs (e.g. to Replicate) first");
  }
  return decision_for(c, *best);
}

}  // namespace

std::vector<OutputSharding> every_decision(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                           const std::vector<TensorInput>& inputs, const MeshPtr& mesh) {
  const Candidates c = candidates_for(op, args, inputs, mesh);
  std::vector<OutputSharding> out;
  for (const auto& st : c.strategies) out.push_back(decision_for(c, st));
  return out;
}

OpStrategy expand_dim_strategies(const std::vector<DimStrategy>& per_dim, int64_t mesh_ndim, size_t n_out, size_t n_in) {
  return expand_over_mesh(per_dim, mesh_ndim, n_out, n_in);
}

double redistribute_cost(const DTensorSpec& spec, const Placements& placements) {
  if (spec.placements == placements) return 0;
  // Every rank must choose the same strategy, so the cost is the one seen from the first coordinate
  // (whose uneven shards are the largest), never this rank's own.
  const Shape coordinate(spec.mesh->ndim(), 0);
  const auto plan = plan_redistribute(spec.meta.shape, static_cast<int64_t>(c10::elementSize(spec.meta.dtype)),
                                      spec.mesh->shape(), coordinate, spec.placements, placements);
  // An alpha-beta model in bytes (kCollectiveLatencyBytes per collective); local steps cost one byte.
  double cost = 0;
  for (const auto& step : plan.steps) {
    const bool communicates = is_collective(step.kind) && spec.mesh->size(step.mesh_dim) > 1;
    cost += communicates ? static_cast<double>(step.bytes_per_rank) + kCollectiveLatencyBytes : 1.0;
  }
  return cost;
}

bool holds_strided(const Placements& placements) {
  return std::any_of(placements.begin(), placements.end(), [](const Placement& p) { return p.is_multi_run_shard(); });
}

const CachedDecision& propagate(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                const std::vector<TensorInput>& inputs, const MeshPtr& mesh) {
  thread_local std::vector<int64_t> key;
  key.clear();
  const auto& schema = op.schema();
  key.push_back(reinterpret_cast<intptr_t>(&schema));
  key.push_back(static_cast<int64_t>(mesh->id()));
  key.push_back(static_cast<int64_t>(inputs.size()));
  for (const auto& in : inputs) append_spec(*in.spec, key);
  for (size_t i = 0; i < args.size(); ++i) append_signature(args[i], schema.arguments()[i], key);
  size_t h = 0;
  for (const int64_t x : key) h = (h ^ static_cast<size_t>(x)) * 0x100000001b3ULL;

  Cache& c = cache();
  if (const uint64_t now = g_generation.load(std::memory_order_acquire); c.generation != now) {
    c.entries.clear();
    c.generation = now;
  }
  auto range = c.entries.equal_range(h);
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second.key != key) continue;
    ++c.stats.hits;
    return it->second.cached;
  }
  ++c.stats.misses;
  if (c.entries.size() > 65536) c.entries.clear();  // bound memory under ever-changing shapes
  CacheEntry entry{key, {decide(op, args, inputs, mesh), {}}};
  // Every later hit has inputs with these very placements and metas, so which input an output's spec
  // equals is known once for all.
  for (const DTensorSpec& out : entry.cached.sharding.outputs) {
    int source = -1;
    for (size_t k = 0; source < 0 && k < inputs.size(); ++k)
      if (inputs[k].spec->placements == out.placements && inputs[k].spec->meta == out.meta) source = static_cast<int>(k);
    entry.cached.output_spec_source.push_back(source);
  }
  return c.entries.emplace(h, std::move(entry))->second.cached;
}

}  // namespace dtensor::detail

namespace dtensor {

PropagationCacheStats propagation_cache_stats() { return detail::cache().stats; }
void clear_propagation_cache() {
  detail::g_generation.fetch_add(1, std::memory_order_acq_rel);
  detail::cache() = detail::Cache{};
}

namespace detail {
void invalidate_propagation_caches() { g_generation.fetch_add(1, std::memory_order_acq_rel); }
}  // namespace detail

std::optional<size_t> OpSchema::input_at_arg(size_t arg) const {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].arg == arg && inputs[i].list_index < 0) return i;
  return std::nullopt;
}

Shape local_output_shape(const OpSchema& schema, const PlacementStrategy& strategy, size_t k) {
  const Shape coordinate = schema.mesh->coordinate().value_or(Shape(schema.mesh->ndim(), 0));
  return local_shape(schema.outputs[k].shape, schema.mesh->shape(), coordinate, strategy.outputs[k]);
}

std::string OpSchema::op_name() const { return detail::qualified_name(schema.operator_name()); }

std::string PlacementStrategy::str() const {
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i) s += (i ? ", " : "") + std::string("(") + to_string(inputs[i]) + ")";
  s += " -> ";
  for (size_t i = 0; i < outputs.size(); ++i) s += (i ? ", " : "") + std::string("(") + to_string(outputs[i]) + ")";
  return s;
}

}  // namespace dtensor
