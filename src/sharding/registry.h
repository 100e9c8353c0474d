#pragma once
// The table of sharding rules, keyed by qualified op name ("aten::add.Tensor"). Registering a rule
// also routes the op's DTensor calls to dtensor's dispatch kernel.

#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <vector>

#include "dtensor/op_schema.h"

namespace dtensor::detail {

// What a rule makes of inputs that are StridedShard or HeadTailShard somewhere (see Placement): both
// are several runs of their dim, together "strided" below.
enum class StridedShards : std::uint8_t {
  // The rule never sees them: it is asked as if they were Replicate, and they are gathered first.
  // Always correct, so the default (a rule may read a shard's offsets, which a strided one has not).
  Gathered,
  // The rule's math treats every index of a sharded dim on its own and its local code never reads
  // where a shard starts (elementwise ops, the rows of a product, reductions, dims a view-family op
  // leaves whole). A strategy sharding such dims then holds for any partition of their indices, a
  // strided one included, provided every tensor sharing the index has the same one: its Shard
  // placements along a strided input's mesh dim are offered as that StridedShard too.
  IndexWise,
  // The rule is asked with the inputs as they are: it places strided inputs itself (views merge and
  // split them; factory ops copy a layout whatever it is), or it reads the inputs' placements to decide
  // what it can offer (batch norm keeps the running statistics it updates in place where they are),
  // any strided input it does not keep being moved to what its strategy asks.
  Own,
  // Strided shards as Gathered, head-tail ones as IndexWise: the rule's kernels read from the chosen
  // strategy which partition of the sequence they get (context-parallel attention, whose causal mask
  // needs to know where each position is).
  HeadTailIndexWise,
};

struct OpRule {
  DimRule dim;    // either a single-mesh-dim rule, expanded over the mesh,
  MeshRule mesh;  // or a rule over the whole mesh
  LocalArgsRule local_args = {};      // optional: arguments to rewrite for the local call
  LocalKernelRule local_kernel = {};  // optional: a replacement for the op on local shards
  GraphFormRule graph_form = {};      // optional: that replacement as graph ops (saved programs need it)
  OutputMetaRule output_metas = {};   // optional: output metas when the op has no Meta kernel
  std::string family = "custom";      // which rules file: "pointwise", "matrix", ...
  StridedShards strided_shards = StridedShards::Gathered;
  // optional: what ranks outside the mesh do instead of the op (random ops draw what the mesh draws)
  std::function<void(const c10::OperatorHandle&, c10::ArrayRef<c10::IValue>)> outside_mesh = {};
};

// The rule for `op`, or nullptr. Shared: registering the op again replaces the table's entry but not
// a rule a caller still holds.
std::shared_ptr<const OpRule> find_rule(const c10::OperatorHandle& op);

// Registers `rule` for every overload of every op named in `names` (base names such as "aten::add",
// which also cover their in-place "aten::add_" forms and out= overloads). Ops that decompose before
// reaching a backend (CompositeImplicitAutograd) are skipped: their parts are what dtensor sees.
// An out= overload gets the rule as its functional form sees it (without the out tensors), each out
// tensor placed like the output it returns; a local kernel's results are copied into the out tensors.
void register_family(const std::vector<std::string>& names, const OpRule& rule);

// Registers `rule` for exactly the named overloads ("aten::add.out"), e.g. out= forms.
void register_overloads(const std::vector<std::string>& qualified_names, const OpRule& rule);

// Registers `rule` for ops that decompose before reaching a backend (CompositeImplicitAutograd:
// aten::linear, aten::matmul, ...). Eager DTensor calls never see them (their parts are dispatched),
// so they are not routed; exported graphs keep them whole (torch.export's training IR), and graph
// passes propagate through them with these rules.
void register_composite(const std::vector<std::string>& qualified_names, const OpRule& rule);

std::string qualified_name(const c10::OperatorName& name);

// An argument an out= overload writes its result to (out, values, grad_input, ...): written, and
// after self (in-place ops write self, which their functional form reads too).
bool is_out_argument(const c10::FunctionSchema& schema, size_t arg);
// Whether the op is an out= overload: it has an out argument.
bool has_out_arguments(const c10::FunctionSchema& schema);

}  // namespace dtensor::detail
