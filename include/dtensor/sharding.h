#pragma once
// Extending and observing sharding propagation: register a strategy for an op (a custom op or one
// dtensor does not cover yet), query what is covered, and scope the implicit replication of plain
// tensors.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/op_schema.h"

namespace dtensor {

// Registers how `op` ("aten::mm", "aten::add.Tensor", "myns::myop") shards, and routes the op's
// DTensor calls through dtensor's dispatch. Registering an op again replaces its rule. Throws when
// the op does not exist in the dispatcher.
void register_dim_rule(const std::string& op, DimRule rule);
void register_mesh_rule(const std::string& op, MeshRule rule);

// PyTorch's register_sharding (torch.distributed.tensor.experimental): for each of `ops`, `fn` returns
// the acceptable shardings of a call along one mesh dim, each the placements of the op's outputs and
// of its arguments in the schema's order, nullopt for an argument that is not a tensor (or a None
// one), as PyTorch writes [Shard(0), None, None] for softmax(x, dim, half_to_float). Propagation
// expands them over every mesh dim and picks by cost, as for register_dim_rule, whose per-dim
// strategies they become (a Tensor[] argument's one placement applies to each of its tensors). It
// replaces a rule the op has. A sharding whose placements do not match the call's tensors raises
// DTensorError naming the op.
struct AcceptableSharding {
  std::vector<std::optional<Placement>> outputs;
  std::vector<std::optional<Placement>> inputs;
};
using ShardingFn = std::function<std::vector<AcceptableSharding>(const OpSchema&)>;
void register_sharding(const std::vector<std::string>& ops, const ShardingFn& fn);

bool has_sharding_rule(const std::string& op);
std::vector<std::string> ops_with_sharding_rules();
// The family of rules an op belongs to ("pointwise", "matrix", "view", ..., or "custom" for rules
// registered through this header); empty when the op has no rule.
std::string sharding_rule_family(const std::string& op);
// For an out= overload that shares its functional form's rule ("aten::mm.out"), that form
// ("aten::mm"); empty otherwise.
std::string functional_form_sharing_rule(const std::string& op);

// How attention on q, k and v sharded along the sequence over a mesh dim (context parallelism) runs:
// Auto takes the method that moves fewer bytes over that dim (all-to-all only where the heads divide
// by its ranks); Ring passes key/value blocks around it; AllToAll (DeepSpeed-Ulysses) trades the
// sequence shard for a head shard and back, and refuses heads that do not divide (naming the op and
// the mesh dim). Process-wide; every rank must set the same.
enum class ContextParallelAttention { Auto, Ring, AllToAll };
void set_context_parallel_attention(ContextParallelAttention method);
ContextParallelAttention context_parallel_attention();

// Whether attention inputs sharded along the sequence hold it load balanced: cut into 2n equal chunks,
// rank r of the mesh dim holding chunks r and 2n-1-r (head-tail), so that causal attention costs every
// rank alike. The order is the data's (context_parallel, in context_parallel.h, shards buffers so and
// turns this on while alive, as PyTorch's _cp_options.enable_load_balance); while on, causal attention
// on such inputs runs only as context-parallel attention, and refuses a mask or dropout, naming the op
// and the mesh dim. Process-wide; every rank must set the same.
void set_context_parallel_load_balance(bool head_tail);
bool context_parallel_load_balance();

// While alive on this thread, plain (non-DTensor) tensors mixed into DTensor ops act as Replicate
// instead of raising an error. 0-d plain tensors always act as Replicate.
class ImplicitReplicationGuard {
 public:
  ImplicitReplicationGuard();
  ~ImplicitReplicationGuard();
  ImplicitReplicationGuard(const ImplicitReplicationGuard&) = delete;
  ImplicitReplicationGuard& operator=(const ImplicitReplicationGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};

struct PropagationCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
};
// This thread's propagation cache counters (since the thread started or the last clear).
PropagationCacheStats propagation_cache_stats();
void clear_propagation_cache();

}  // namespace dtensor
