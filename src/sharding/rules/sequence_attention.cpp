#include "sequence_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>

#include "../kernels/context_attention.h"
#include "../propagation.h"
#include "dtensor/errors.h"
#include "dtensor/layout.h"
#include "dtensor/sharding.h"
#include "optional_tensors.h"

namespace dtensor {
namespace {

std::atomic<ContextParallelAttention> chosen_method{ContextParallelAttention::Auto};
std::atomic<bool> load_balanced{false};

}  // namespace

void set_context_parallel_attention(ContextParallelAttention method) {
  chosen_method = method;
  detail::invalidate_propagation_caches();  // the strategies' costs and kernels follow the method
}

ContextParallelAttention context_parallel_attention() { return chosen_method; }

void set_context_parallel_load_balance(bool head_tail) {
  load_balanced = head_tail;
  detail::invalidate_propagation_caches();  // the kernels and the strategies allowed follow the order
}

bool context_parallel_load_balance() { return load_balanced; }

namespace rules {
namespace {

constexpr int64_t kHeadsAxis = 1, kSequenceAxis = 2;

double bytes_of(const TensorMeta& m) { return static_cast<double>(numel(m.shape) * static_cast<int64_t>(c10::elementSize(m.dtype))); }

// What the ring moves per rank over `ranks`: each pass sends this rank's key/value block on ranks - 1
// times, a message each.
double ring_cost(const OpSchema& s, const SequenceRoles& roles, int64_t ranks) {
  const double blocks = bytes_of(s.input(*s.input_at_arg(roles.key)).meta) + bytes_of(s.input(*s.input_at_arg(roles.value)).meta);
  return roles.ring_passes * (ranks - 1) * (blocks / ranks + kCollectiveLatencyBytes);
}

// What the all-to-alls move per rank: every input and output once, each rank keeping 1/ranks of its
// block, an all-to-all each.
double all_to_all_cost(const OpSchema& s, int64_t ranks) {
  double bytes = 0;
  for (size_t i = 0; i < s.inputs.size(); ++i) bytes += bytes_of(s.input(i).meta);
  for (const TensorMeta& out : s.outputs) bytes += bytes_of(out);
  const double exchanges = static_cast<double>(s.inputs.size() + s.outputs.size());
  return bytes * (ranks - 1) / (ranks * ranks) + exchanges * kCollectiveLatencyBytes;
}

ContextParallelAttention method_on(const OpSchema& s, const SequenceRoles& roles, int64_t ranks) {
  const ContextParallelAttention forced = context_parallel_attention();
  if (forced != ContextParallelAttention::Auto) return forced;  // all-to-all's kernel refuses heads that do not divide
  const bool heads_divide = s.input(*s.input_at_arg(0)).meta.shape[kHeadsAxis] % ranks == 0 &&
                            s.input(*s.input_at_arg(roles.key)).meta.shape[kHeadsAxis] % ranks == 0;
  if (!heads_divide) return ContextParallelAttention::Ring;
  return all_to_all_cost(s, ranks) < ring_cost(s, roles, ranks) ? ContextParallelAttention::AllToAll : ContextParallelAttention::Ring;
}

double sequence_cost(const OpSchema& s, const SequenceRoles& roles, int64_t ranks) {
  return method_on(s, roles, ranks) == ContextParallelAttention::Ring ? ring_cost(s, roles, ranks) : all_to_all_cost(s, ranks);
}

detail::ContextAttention call_of(const OpSchema& s, const PlacementStrategy& chosen, int64_t mesh_dim) {
  const auto scale = argument(s, "scale");
  return {nullptr, mesh_dim, s.input(*s.input_at_arg(0)).meta.shape[kSequenceAxis], argument(s, "is_causal").toBool(),
          scale.isNone() ? std::nullopt : std::optional<double>(scale.toDouble()), load_balanced_sequence(chosen, mesh_dim)};
}

}  // namespace

bool sequence_applies(const OpSchema& s, const SequenceRoles& roles) {
  const auto dropout = s.schema.argumentIndexWithName("dropout_p");
  if ((dropout && s.args[*dropout].toDouble() != 0) || s.input_at_arg(roles.mask)) return false;
  const Shape& q = s.input(*s.input_at_arg(0)).meta.shape;
  const Shape& k = s.input(*s.input_at_arg(roles.key)).meta.shape;
  return q.size() == 4 && k.size() == 4 && q[kSequenceAxis] == k[kSequenceAxis];
}

DimStrategy sequence_strategy(const OpSchema& s) {
  return {Placements(s.outputs.size(), Shard(kSequenceAxis)), Placements(s.inputs.size(), Shard(kSequenceAxis))};
}

namespace {

// The mesh dim that `keys` (placements) shard the sequence over, if any.
std::optional<int64_t> sequence_mesh_dim(const Placements& keys) {
  const auto at = std::find_if(keys.begin(), keys.end(), [](const Placement& p) {
    return p == Placement(Shard(kSequenceAxis)) || p == Placement(HeadTailShard(kSequenceAxis));
  });
  return at == keys.end() ? std::nullopt : std::optional<int64_t>(at - keys.begin());
}

}  // namespace

std::optional<int64_t> sequence_dim(const OpSchema& s, const SequenceRoles& roles, const PlacementStrategy& chosen) {
  return sequence_mesh_dim(chosen.inputs[*s.input_at_arg(roles.key)]);
}

bool load_balanced_sequence(const PlacementStrategy& chosen, int64_t mesh_dim) {
  return chosen.inputs.front()[static_cast<size_t>(mesh_dim)].is_head_tail_shard() || context_parallel_load_balance();
}

namespace {

// The mesh dim the keys arrive sharded along the sequence over, if any.
std::optional<int64_t> arriving_sequence_dim(const OpSchema& s, const SequenceRoles& roles) {
  return sequence_mesh_dim(s.input(*s.input_at_arg(roles.key)).placements);
}

// `st` with its plain sequence shards over `mesh_dim` made head-tail, where the sequence splits into
// 2 chunks a rank; nullopt where it does not.
std::optional<PlacementStrategy> as_head_tail(PlacementStrategy st, const OpSchema& s, int64_t mesh_dim) {
  if (s.input(*s.input_at_arg(0)).meta.shape[kSequenceAxis] % (2 * s.mesh->size(mesh_dim)) != 0) return std::nullopt;
  const auto m = static_cast<size_t>(mesh_dim);
  for (std::vector<Placements>* tensors : {&st.inputs, &st.outputs})
    for (Placements& placements : *tensors)
      if (placements[m] == Placement(Shard(kSequenceAxis))) placements[m] = HeadTailShard(kSequenceAxis);
  return st;
}

// Under load balancing a sequence that arrives sharded (plainly) is in head-tail order. Causal attention
// reads that order right only as the sequence kernels (they are the only strategies left), and a mask
// or dropout, laid out in the sequence's own order, is refused. A sequence arriving otherwise is in
// order (whole, or a HeadTailShard, which its rules see as whole: gathered or kept as it is), so the
// sequence kernels run on its head-tail shards rather than on plain ones they would misread. Full
// attention without a mask does not depend on the order.
void keep_load_balanced_order(const OpSchema& s, const SequenceRoles& roles, OpStrategy& all) {
  if (!context_parallel_load_balance()) return;
  const auto arriving = arriving_sequence_dim(s, roles);
  if (arriving && !sequence_applies(s, roles))
    throw DTensorError(s.op_name() + ": attention on a load-balanced sequence sharded over " + s.mesh->dim_label(*arriving) +
                       " runs only as context-parallel attention, which takes no attention mask (its order is not the sequence's) and no "
                       "dropout; pass is_causal alone, or shard the sequence without load balancing");
  if (!argument(s, "is_causal").toBool()) return;
  OpStrategy kept;
  for (PlacementStrategy& st : all) {
    const auto dim = sequence_dim(s, roles, st);
    if (dim == arriving) {
      kept.push_back(std::move(st));
    } else if (!arriving) {
      if (auto head_tail = as_head_tail(std::move(st), s, *dim)) kept.push_back(std::move(*head_tail));
    }
  }
  all = std::move(kept);
}

}  // namespace

OpStrategy sequence_over_the_mesh(const OpSchema& s, const SequenceRoles& roles, const std::vector<DimStrategy>& per_dim) {
  OpStrategy all = detail::expand_dim_strategies(per_dim, s.mesh->ndim(), s.outputs.size(), s.inputs.size());
  keep_load_balanced_order(s, roles, all);
  if (!sequence_applies(s, roles)) return all;
  const size_t q = *s.input_at_arg(0), k = *s.input_at_arg(roles.key);
  const auto along_sequence = [](const Placements& p) {
    return std::count_if(p.begin(), p.end(), [](const Placement& x) { return x.is_sharding() && x.dim() == kSequenceAxis; });
  };
  std::erase_if(all, [&](const PlacementStrategy& st) { return along_sequence(st.inputs[k]) > 0 && along_sequence(st.inputs[q]) > 1; });
  for (PlacementStrategy& st : all)
    if (const auto dim = sequence_dim(s, roles, st)) st.kernel_cost += sequence_cost(s, roles, s.mesh->size(*dim));
  return all;
}

// The kernels keep the mesh as a plain pointer (propagation's cache must not keep meshes alive) and
// hold a reference only during the call.
// Whether the kernels run the ring (else the all-to-all, whose heads are checked here, naming the op).
bool runs_ring(const OpSchema& s, const SequenceRoles& roles, int64_t mesh_dim) {
  if (method_on(s, roles, s.mesh->size(mesh_dim)) == ContextParallelAttention::Ring) return true;
  detail::check_all_to_all_heads(s.input(*s.input_at_arg(0)).meta.shape[kHeadsAxis], s.input(*s.input_at_arg(roles.key)).meta.shape[kHeadsAxis],
                                 *s.mesh, mesh_dim, s.op_name());
  return false;
}

LocalKernel sequence_forward_kernel(const OpSchema& s, const SequenceRoles& roles, const PlacementStrategy& chosen, int64_t mesh_dim) {
  const bool ring = runs_ring(s, roles, mesh_dim);
  return [mesh = s.mesh, call = call_of(s, chosen, mesh_dim), ring, lse_dtype = s.outputs[1].dtype](const c10::OperatorHandle& op,
                                                                                          torch::jit::Stack& stack) mutable {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    call.mesh = mesh->shared_from_this();
    const auto run = ring ? detail::ring_attention_forward : detail::all_to_all_attention_forward;
    auto [out, lse] = run(args[0].toTensor(), args[1].toTensor(), args[2].toTensor(), call);
    call.mesh.reset();
    torch::jit::push(stack, out, lse.to(lse_dtype));
  };
}

LocalKernel sequence_backward_kernel(const OpSchema& s, const SequenceRoles& roles, const PlacementStrategy& chosen, int64_t mesh_dim) {
  const bool ring = runs_ring(s, roles, mesh_dim);
  return [mesh = s.mesh, call = call_of(s, chosen, mesh_dim), ring](const c10::OperatorHandle& op, torch::jit::Stack& stack) mutable {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    call.mesh = mesh->shared_from_this();
    const auto run = ring ? detail::ring_attention_backward : detail::all_to_all_attention_backward;
    auto [dq, dk, dv] = run(args[0].toTensor(), args[1].toTensor(), args[2].toTensor(), args[3].toTensor(), args[4].toTensor(), args[5].toTensor(), call);
    call.mesh.reset();
    torch::jit::push(stack, dq, dk, dv);
  };
}

}  // namespace rules
}  // namespace dtensor
