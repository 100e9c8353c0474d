#include "dispatch.h"

#include <ATen/ATen.h>

#include "../mesh/collectives.h"
#include "../redistribute/executor.h"
#include "../redistribute/redistribute_log.h"
#include "../tensor/as_dtensor.h"
#include "eager_graph_form.h"
#include "dtensor/comm_debug.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "dtensor/sharding.h"
#include "dtensor/world.h"
#include "propagation.h"
#include "registry.h"

namespace dtensor {
namespace {
thread_local bool implicit_replication = false;
}

ImplicitReplicationGuard::ImplicitReplicationGuard() : previous_(implicit_replication) { implicit_replication = true; }
ImplicitReplicationGuard::~ImplicitReplicationGuard() { implicit_replication = previous_; }
bool ImplicitReplicationGuard::active() { return implicit_replication; }

}  // namespace dtensor

namespace dtensor::detail {
namespace {

// Calls `visit(tensor, arg, list_index)` for every defined tensor among the arguments.
template <typename Visit>
void for_each_tensor(c10::ArrayRef<c10::IValue> args, Visit&& visit) {
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      if (v.toTensor().defined()) visit(v.toTensor(), i, int64_t{-1});
    } else if (v.isTensorList()) {
      const auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) visit(list.get(j), i, static_cast<int64_t>(j));
    } else if (v.isList()) {
      const auto& list = v.toListRef();
      for (size_t j = 0; j < list.size(); ++j)
        if (list[j].isTensor()) visit(list[j].toTensor(), i, static_cast<int64_t>(j));
    }
  }
}

MeshPtr find_mesh(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  MeshPtr mesh;
  for_each_tensor(args, [&](const at::Tensor& t, size_t, int64_t) {
    const DTensorImpl* d = as_dtensor(t);
    if (d == nullptr) return;
    if (!mesh) mesh = d->spec().mesh;
    else if (!same_mesh(mesh, d->spec().mesh))
      throw DTensorError("op " + qualified_name(op.operator_name()) + " got DTensors on different meshes, " +
                         mesh->str() + " and " + d->spec().mesh->str() + "; bring them onto one mesh first");
  });
  return mesh;
}

SpecPtr replicated_spec(const at::Tensor& t, const MeshPtr& mesh) {
  return std::make_shared<const DTensorSpec>(DTensorSpec{
      mesh, Placements(mesh->ndim(), Replicate()), TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()}});
}

void collect_inputs(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, const MeshPtr& mesh,
                    std::vector<TensorInput>& inputs) {
  for_each_tensor(args, [&](const at::Tensor& t, size_t arg, int64_t index) {
    if (const DTensorImpl* d = as_dtensor(t)) {
      inputs.push_back(TensorInput{arg, index, d->shared_spec()});
    } else if (t.dim() == 0 || ImplicitReplicationGuard::active()) {
      inputs.push_back(TensorInput{arg, index, replicated_spec(t, mesh)});
    } else {
      throw DTensorError("op " + qualified_name(op.operator_name()) + " got a plain tensor of shape " +
                         shape_str(t.sizes().vec()) + " (argument '" + op.schema().arguments()[arg].name() +
                         "') mixed with DTensors; distribute it (distribute_tensor / from_local), or treat it as "
                         "Replicate inside a dtensor::ImplicitReplicationGuard");
    }
  });
}

// An op's result as a DTensor: a new (non-view) result laid out as its global strides say, a view
// kept aliasing its input.
at::Tensor wrap_result(c10::IValue& slot, const DTensorSpec& out, bool is_view, SpecPtr spec) {
  at::Tensor local = std::move(slot).toTensor();
  if (!is_view) local = in_global_layout(local, out.meta);
  return wrap_local(std::move(local), std::move(spec));
}

bool written(const c10::FunctionSchema& schema, const TensorInput& in) {
  const auto* alias = schema.arguments()[in.arg].alias_info();
  return alias != nullptr && alias->isWrite();
}

// A Partial tensor an in-place op writes to is reduced first, in its own buffer, so that the DTensor
// (which the op returns) holds the result. Every other holder of that buffer would see the reduced
// values under its old Partial spec, so the buffer must be the DTensor's alone on every rank: the
// ranks agree on that (one small all-reduce) before any of them refuses, so none is left waiting.
void reduce_written_in_place(const c10::OperatorHandle& op, const at::Tensor& t, const TensorInput& in,
                             const Placements& target) {
  auto* impl = const_cast<DTensorImpl*>(as_dtensor(t));
  const at::Tensor& local = impl->local();
  const bool shared = local.use_count() > 1 || (local.has_storage() && local.storage().use_count() > 1);
  if (any_rank(*in.spec->mesh, shared))
    throw DTensorError("op " + qualified_name(op.operator_name()) + " writes to a Partial DTensor (" + in.spec->str() +
                       ") and must reduce it first, but its local buffer is shared on some rank (a view of it, the "
                       "tensor given to from_local, or autograd holds it); use the out-of-place op, or redistribute "
                       "to Replicate first");
  at::Tensor reduced = redistribute_local(local, *in.spec, target, Direction::Forward, Ownership::Donated);
  if (!reduced.is_same(local)) const_cast<at::Tensor&>(local).copy_(reduced);
  impl->reset_spec(std::make_shared<const DTensorSpec>(in.spec->with_placements(target)));
}

// The local tensor to run the op with: the shard, moved to the chosen placements when needed.
at::Tensor local_input(const at::Tensor& t, const TensorInput& in, const std::optional<Placements>& move) {
  const DTensorImpl* d = as_dtensor(t);
  at::Tensor local = d ? d->local() : t;
  // A moved shard comes in the collective's layout: put it in the tensor's own dim order (views need it).
  return move ? in_global_layout(redistribute_local(local, *in.spec, *move), in.spec->meta) : local;
}

// A DTensor made by a view op whose input had to move first (a slice of a sharded dim: the shards are
// gathered, or padded into a Partial) holds a copy, not a view of its base's shard, and a write through
// it would be lost without a word (LibTorch's own derivatives write through such views: ormqr's lost
// its tau gradient so). Autograd knows the view's base; the shards say whether they share storage. The
// view op's decision is the same on every rank, so every rank refuses alike.
void refuse_write_through_copied_view(const c10::OperatorHandle& op, const at::Tensor& t) {
  if (!t.is_view()) return;
  const DTensorImpl* view = as_dtensor(t);
  const at::Tensor base_tensor(t._base());
  const DTensorImpl* base = as_dtensor(base_tensor);
  if (!view || !base || view->local().is_alias_of(base->local())) return;
  throw DTensorError("op " + qualified_name(op.operator_name()) + " writes to a DTensor (" + view->spec().str() +
                     ") that is a view of another (" + base->spec().str() + "), but the view op had to redistribute its "
                     "input, so the view holds a copy and the write would not reach its base. Redistribute the base so "
                     "that the view needs no move (slice a dim that is not sharded), or write to the base itself");
}

// The local tensor input `in` runs with; a written one that must move (a Partial reduced in place)
// moves in its own buffer, for the caller's DTensor to hold the result.
at::Tensor local_for(const c10::OperatorHandle& op, const at::Tensor& t, const TensorInput& in, const std::optional<Placements>& move) {
  if (!written(op.schema(), in)) return local_input(t, in, move);
  refuse_write_through_copied_view(op, t);
  if (!move) return local_input(t, in, move);
  reduce_written_in_place(op, t, in, *move);
  return as_dtensor(t)->local();
}

void replace_inputs(const c10::OperatorHandle& op, c10::IValue* args, const std::vector<TensorInput>& inputs,
                    const OutputSharding& decision) {
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TensorInput& in = inputs[k];
    c10::IValue& slot = args[in.arg];
    if (in.list_index < 0) {
      slot = local_for(op, slot.toTensor(), in, decision.input_moves[k]);
    } else if (slot.isTensorList()) {
      auto list = slot.toTensorList().copy();  // never mutate the caller's list
      list.set(in.list_index, local_for(op, list.get(in.list_index), in, decision.input_moves[k]));
      slot = list;
    } else {
      auto list = c10::List<std::optional<at::Tensor>>(slot.toOptionalTensorList()).copy();
      list.set(in.list_index, local_for(op, *list.get(in.list_index), in, decision.input_moves[k]));
      slot = list;
    }
  }
}

// Empty local shards for ranks outside the mesh, which do not run the op.
// What ranks outside the mesh return: one value per schema return, shaped like the op's own returns
// (a Tensor[] return holds every remaining output), with empty local shards.
void push_empty_outputs(const c10::FunctionSchema& schema, const DeviceMesh& mesh, const OutputSharding& decision,
                        torch::jit::Stack* stack) {
  auto empty = [](const DTensorSpec& spec) { return at::empty({0}, at::TensorOptions().dtype(spec.meta.dtype)); };
  size_t next = 0;
  for (const auto& r : schema.returns()) {
    const auto kind = r.type()->kind();
    if (kind == c10::TypeKind::TensorType) {
      stack->push_back(next < decision.outputs.size() ? c10::IValue(empty(decision.outputs[next++])) : c10::IValue(at::Tensor()));
    } else if (kind == c10::TypeKind::ListType) {
      c10::List<at::Tensor> list;
      while (next < decision.outputs.size()) list.push_back(empty(decision.outputs[next++]));
      stack->push_back(list);
    } else {
      // A number (item(), equal ...) exists only on the mesh's ranks: a made-up value here would be a
      // silent wrong answer.
      throw DTensorError("op " + qualified_name(schema.operator_name()) + " returns a number computed on " +
                         mesh.str() + ", which this rank (" + std::to_string(mesh.world()->rank()) +
                         ") is not part of; read it on the mesh's ranks only, or broadcast it");
    }
  }
}

}  // namespace

// The strategy's local kernel, or its graph form where tests ask for forms (eager_graph_form.h).
void run_local_kernel(const c10::OperatorHandle& op, const OutputSharding& decision, const DeviceMesh& mesh, torch::jit::Stack& stack) {
  if (!decision.graph_form) return decision.local_kernel(op, stack);
  count_call_with_a_graph_form();
  if (graph_forms_run_eagerly()) return run_graph_form(decision.graph_form, mesh, op, stack);
  decision.local_kernel(op, stack);
}

void record_op_for_debug(const c10::OperatorHandle& op, const std::vector<TensorInput>& inputs) {
  auto* debug = CommDebugMode::active();
  if (debug == nullptr) return;
  std::vector<Placements> placements;
  for (const auto& in : inputs) placements.push_back(in.spec->placements);
  debug->record_op(qualified_name(op.operator_name()), std::move(placements));
}

SpecPtr output_spec(const CachedDecision& cached, size_t k, const MeshPtr& mesh, const std::vector<TensorInput>& inputs) {
  if (const int source = cached.output_spec_source[k]; source >= 0 && inputs[source].spec->mesh == mesh)
    return inputs[source].spec;
  const DTensorSpec& out = cached.sharding.outputs[k];
  return std::make_shared<const DTensorSpec>(DTensorSpec{mesh, out.placements, out.meta});
}

void composite_fallback_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (find_rule(op)) return dispatch_kernel(op, keys, stack);
  const std::string name = qualified_name(op.operator_name());
  if (auto* debug = CommDebugMode::active()) {
    debug->record_op(name, {});
    debug->record_composite_fallback(name);
  }
  const size_t n = op.schema().arguments().size();
  log_composite_fallback(name, *find_mesh(op, c10::ArrayRef<c10::IValue>(stack->data() + (stack->size() - n), n)));
  // The op has no kernel of its own for any backend, so every backend's entry holds the composite
  // implementation: run it (its inner calls dispatch on the DTensors again).
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

void dispatch_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  c10::IValue* args = stack->data() + (stack->size() - n);
  const c10::ArrayRef<c10::IValue> arg_view(args, n);

  const CommContext context(schema.name().c_str());
  const MeshPtr mesh = find_mesh(op, arg_view);
  std::vector<TensorInput> inputs;
  inputs.reserve(4);
  collect_inputs(op, arg_view, mesh, inputs);
  record_op_for_debug(op, inputs);
  const CachedDecision& cached = propagate(op, arg_view, inputs, mesh);
  const OutputSharding& decision = cached.sharding;

  // Written (in-place / out=) arguments are returned as the caller's own DTensors.
  const std::vector<c10::IValue> originals =
      schema.is_mutable() ? std::vector<c10::IValue>(args, args + n) : std::vector<c10::IValue>{};
  if (mesh->coordinate()) {
    replace_inputs(op, args, inputs, decision);
    for (const auto& [index, value] : decision.local_args) args[index] = value;
    if (decision.local_kernel) run_local_kernel(op, decision, *mesh, *stack);
    else op.callBoxed(*stack);
  } else {
    if (const auto rule = find_rule(op); rule->outside_mesh) rule->outside_mesh(op, arg_view);
    torch::jit::drop(*stack, n);
    push_empty_outputs(schema, *mesh, decision, stack);
  }

  const size_t r = schema.returns().size();
  c10::IValue* returns = stack->data() + (stack->size() - r);
  size_t next_output = 0;
  // The outputs' specs come from the global metas; a local kernel returning more tensors than those
  // (a rule's output metas out of step with the kernel) is reported, not indexed past.
  auto take_output = [&]() {
    if (next_output >= decision.outputs.size())
      throw DTensorError("op " + schema.name() + " returned more tensors on local shards than its " +
                         std::to_string(decision.outputs.size()) + " global output metas describe: its sharding rule's "
                         "output metas are out of step with this LibTorch's kernel");
    return next_output++;
  };
  for (size_t j = 0; j < r; ++j) {
    const auto* alias = schema.returns()[j].alias_info();
    if (alias && alias->isWrite()) {
      for (size_t i = 0; i < n; ++i) {
        const auto* a = schema.arguments()[i].alias_info();
        if (a && a->beforeSets() == alias->beforeSets()) returns[j] = originals[i];
      }
      // An in-place view (t_) changed the DTensor's shape and placements along with its local tensor.
      auto* impl = const_cast<DTensorImpl*>(as_dtensor(returns[j].toTensor()));
      const size_t k = take_output();
      const DTensorSpec& result = decision.outputs[k];
      if (impl != nullptr && (impl->spec().placements != result.placements || impl->spec().meta != result.meta))
        impl->reset_spec(output_spec(cached, k, mesh, inputs));
    } else if (returns[j].isTensor()) {
      // Undefined returns (e.g. gradients not asked for) have no output spec. A new (non-view) result
      // is laid out as its global strides say; a view keeps aliasing its input.
      if (returns[j].toTensor().defined()) {
        const size_t k = take_output();
        returns[j] = wrap_result(returns[j], decision.outputs[k], alias != nullptr, output_spec(cached, k, mesh, inputs));
      }
    } else if (returns[j].isTensorList()) {
      c10::List<at::Tensor> wrapped;
      for (const at::Tensor& t : returns[j].toTensorList()) {
        const size_t k = take_output();
        wrapped.push_back(make_dtensor(alias ? t : in_global_layout(t, decision.outputs[k].meta),
                                       output_spec(cached, k, mesh, inputs)));
      }
      returns[j] = wrapped;
    }
  }
}

}  // namespace dtensor::detail
