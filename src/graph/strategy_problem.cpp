#include "strategy_problem.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>
#include <unordered_map>

#include "../sharding/for_graph.h"
#include "dtensor/errors.h"
#include "dtensor/parallel_style.h"
#include "dtensor/sharding.h"
#include "meta_tensor.h"
#include "strategy_key.h"

namespace dtensor::graph::detail {
namespace {

SpecPtr spec_of(const Value& v, const Placements& placements, const MeshPtr& mesh) {
  return std::make_shared<const DTensorSpec>(DTensorSpec{mesh, placements, v.meta});
}

// The call as propagation sees it: Meta stand-ins of the global tensors, numbers and sizes as values.
struct Call {
  std::vector<c10::IValue> args;
  std::vector<TensorInput> inputs;
  NodeSharding sharding;
};

Call call_of(const Node& node, const Annotations& marks, const MeshPtr& mesh) {
  Call c;
  auto add_input = [&](size_t arg, int64_t index, const Value& v) {
    const Placements* placements = marks.placements(v);
    if (!placements) throw DTensorError("graph: node '" + node.name + "' reads %" + v.name + ", which has no placements yet");
    c.inputs.push_back(TensorInput{arg, index, spec_of(v, *placements, mesh)});
    c.sharding.tensor_args.push_back(arg);
    c.sharding.list_index.push_back(index);
  };
  // A number given for a Tensor argument is a replicated 0-d tensor, as eager dispatch sees it.
  auto add_number = [&](size_t arg, const c10::Scalar& number) {
    const at::Tensor t = wrapped_number(number);
    c.args.emplace_back(t);
    c.inputs.push_back(TensorInput{arg, -1, std::make_shared<const DTensorSpec>(DTensorSpec{
                                                 mesh, Placements(mesh->ndim(), Replicate()), TensorMeta{{}, {}, t.scalar_type()}})});
    c.sharding.tensor_args.push_back(arg);
    c.sharding.list_index.push_back(-2);  // not a graph value: never moved
  };
  for (size_t i = 0; i < node.args().size(); ++i) {
    const Arg& a = node.args()[i];
    switch (a.kind) {
      case Arg::Kind::Constant: c.args.push_back(a.constant); break;
      case Arg::Kind::Number: add_number(i, a.constant.toScalar()); break;
      case Arg::Kind::Tensor:
        c.args.emplace_back(meta_tensor(*a.values[0]));
        add_input(i, -1, *a.values[0]);
        break;
      case Arg::Kind::Tensors: {
        c10::List<at::Tensor> list;
        for (size_t j = 0; j < a.values.size(); ++j) {
          list.push_back(meta_tensor(*a.values[j]));
          add_input(i, static_cast<int64_t>(j), *a.values[j]);
        }
        c.args.emplace_back(list);
        break;
      }
      case Arg::Kind::OptionalTensors: {
        c10::List<std::optional<at::Tensor>> list;
        for (size_t j = 0; j < a.values.size(); ++j) {
          list.push_back(a.values[j] ? std::optional<at::Tensor>(meta_tensor(*a.values[j])) : std::nullopt);
          if (a.values[j]) add_input(i, static_cast<int64_t>(j), *a.values[j]);
        }
        c.args.emplace_back(list);
        break;
      }
      case Arg::Kind::SymInt:
        if (a.tensor_number) add_number(i, a.sizes[0].hint());
        else c.args.emplace_back(a.sizes[0].hint());
        break;
      case Arg::Kind::SymInts: {
        std::vector<int64_t> sizes;
        for (const SymSize& s : a.sizes) sizes.push_back(s.hint());
        c.args.emplace_back(sizes);
        break;
      }
    }
  }
  return c;
}

std::vector<Value*> tensor_outputs(const Node& node) {
  std::vector<Value*> out;
  for (Value* v : node.outputs)
    if (v->is_tensor()) out.push_back(v);
  return out;
}

bool all_replicate(const Placements& p) {
  for (const auto& x : p)
    if (!x.is_replicate()) return false;
  return true;
}

// A view-like op (permute, t, view, expand, ...; see is_view_like) of a parameter, buffer or constant.
bool is_view_of_state(const Node& node, const std::set<const Value*>& state) {
  if (!is_view_like(node)) return false;
  const auto inputs = node.inputs();
  return !inputs.empty() && std::all_of(inputs.begin(), inputs.end(), [&](const Value* v) { return !v->is_tensor() || state.count(v); });
}

bool writes_an_input(const Node& node) {
  for (const auto& a : node.op->schema().arguments())
    if (a.alias_info() && a.alias_info()->isWrite()) return true;
  return false;
}

// Values some node writes in place: their placements must stay what the writer's strategy assumed.
std::set<const Value*> written_values(const Graph& graph) {
  std::set<const Value*> out;
  for (const Node* node : graph.nodes()) {
    if (!node->op) continue;
    const auto& schema_args = node->op->schema().arguments();
    for (size_t i = 0; i < node->args().size() && i < schema_args.size(); ++i)
      if (schema_args[i].alias_info() && schema_args[i].alias_info()->isWrite())
        for (const Value* v : node->args()[i].values) out.insert(v);
  }
  return out;
}

std::string placements_of(const std::vector<Value*>& inputs, const Annotations& marks) {
  std::string out;
  for (const Value* v : inputs)
    if (v) out += (out.empty() ? "" : ", ") + marks.placements_str(*v);
  return out;
}

// The placements each value may take: those its producer's strategies give it (a graph input or a
// node without options: the one it has).
using PossiblePlacements = std::map<const Value*, std::vector<Placements>>;

// Graph programs hold a StridedShard only where a plan gives one (a packed layer's weights) and where
// it follows from one: a strided input taken as it is or cut from a Replicate value, products and views
// of it, the split into its blocks, a cat joining equal blocks back (the backward of that split), and a
// view merging a sharded dim into the dims before it (a [batch, sequence] shard of the sequence seen
// as [batch * sequence] rows, as every linear layer of a context-parallel model sees it). Moving a
// plain shard to a strided one is left out: reshards of strided values are gathers and chunks only
// (reshard.cpp).
bool keeps_strided_shards_reshardable(const c10::OperatorHandle& op, const OutputSharding& d, const std::vector<TensorInput>& inputs) {
  bool strided_input = false;
  for (size_t k = 0; k < d.chosen.inputs.size(); ++k) {
    const Placements& want = d.chosen.inputs[k];
    if (!dtensor::detail::holds_strided(want)) continue;
    const Placements& have = inputs[k].spec->placements;
    for (size_t m = 0; m < want.size(); ++m)
      if (want[m].is_multi_run_shard() && want[m] != have[m] && !have[m].is_replicate()) return false;
    strided_input = true;
  }
  bool strided_output = false;
  for (const Placements& placements : d.chosen.outputs) strided_output = strided_output || dtensor::detail::holds_strided(placements);
  const std::string& name = op.schema().name();
  return !strided_output || strided_input || name == "aten::cat" || name == "aten::view" || name == "aten::_unsafe_view";
}
// The placements a node reading one value also asks its rule about: those the value may take.
const std::vector<Placements>* probed_placements(const Call& c, const std::vector<Value*>& inputs, const PossiblePlacements& possible) {
  size_t values = 0;
  for (const Value* v : inputs) values += v != nullptr;
  if (values != 1 || c.inputs.size() != 1 || !inputs[0]) return nullptr;
  const auto it = possible.find(inputs[0]);
  return it == possible.end() ? nullptr : &it->second;
}

// Every strategy of the node's rule. Mesh rules (views) offer those that fit the inputs' placements
// as they are; so that a whole-graph choice may change the producers, a node reading one value is
// also asked for every placement that value may take, and any node for Replicate inputs.
std::vector<OutputSharding> options_for(const c10::OperatorHandle& op, const Call& c, const std::vector<Placements>* probed_input,
                                        const MeshPtr& mesh) {
  std::vector<OutputSharding> out;
  std::set<std::string> known, probed = {to_string(c.inputs.empty() ? Placements{} : c.inputs[0].spec->placements)};
  auto probe = [&](std::vector<TensorInput> variant) {
    for (OutputSharding& d : dtensor::detail::every_decision(op, c.args, variant, mesh))
      if (keeps_strided_shards_reshardable(op, d, variant) && known.insert(d.chosen.str()).second) out.push_back(std::move(d));
  };
  probe(c.inputs);
  auto placed = [&](const TensorInput& in, const Placements& p) {
    TensorInput moved = in;
    moved.spec = std::make_shared<const DTensorSpec>(DTensorSpec{mesh, p, in.spec->meta});
    return moved;
  };
  if (probed_input)
    for (const Placements& p : *probed_input)
      if (probed.insert(to_string(p)).second) probe({placed(c.inputs[0], p)});
  std::vector<TensorInput> replicated = c.inputs;
  bool differs = false;
  for (TensorInput& in : replicated) {
    if (all_replicate(in.spec->placements)) continue;
    in = placed(in, Placements(mesh->ndim(), Replicate()));
    differs = true;
  }
  if (differs) probe(replicated);
  return out;
}

// options_for, answered once per distinct call (strategy_key.h): the layers of a model repeat.
using OptionsCache = std::unordered_map<std::string, std::vector<OutputSharding>>;
std::vector<OutputSharding> cached_options_for(const c10::OperatorHandle& op, const Call& c, const std::vector<Value*>& inputs,
                                               const PossiblePlacements& possible, const MeshPtr& mesh, OptionsCache& cache) {
  const std::vector<Placements>* probed_input = probed_placements(c, inputs, possible);
  std::vector<const Placements*> placements;
  for (const TensorInput& in : c.inputs) placements.push_back(&in.spec->placements);
  const std::optional<std::string> key = strategy_key(op, c.args, placements, probed_input);
  if (!key) return options_for(op, c, probed_input, mesh);
  if (const auto it = cache.find(*key); it != cache.end()) return it->second;
  return cache.emplace(*key, options_for(op, c, probed_input, mesh)).first->second;
}

// Drops the strategies the options rule out: ones placing anything off Replicate along mesh dims other
// than `only_mesh_dim`, and ones moving state (parameters, buffers; user inputs where kept) other than in place (a collective,
// or a shard padded to the whole). Should that
// leave none, the state restriction is lifted for this node (the op needs its parameter elsewhere).
void keep_allowed(NodeOptions& n, const MarkOptions& options, const std::set<const Value*>& state, StrategyChoice& choice) {
  auto off_dim = [&](const Placements& p) {
    for (int64_t m = 0; m < static_cast<int64_t>(p.size()); ++m)
      if (options.only_mesh_dim && m != *options.only_mesh_dim && !p[m].is_replicate()) return true;
    return false;
  };
  auto on_dims = [&](const OutputSharding& d) {
    for (const auto& p : d.chosen.inputs)
      if (off_dim(p)) return false;
    for (const auto& p : d.chosen.outputs)
      if (off_dim(p)) return false;
    return true;
  };
  auto keeps_state = [&](const OutputSharding& d) {
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k] && state.count(n.inputs[k]) && !choice.moves_in_place(n.inputs[k], choice.at(n.inputs[k]), d.chosen.inputs[k]))
        return false;
    return true;
  };
  std::vector<OutputSharding> allowed, on_mesh_dims;
  for (auto& d : n.options) {
    if (!on_dims(d)) continue;
    if (!options.keep_state_in_place || keeps_state(d)) allowed.push_back(d);
    on_mesh_dims.push_back(std::move(d));
  }
  n.options = allowed.empty() ? std::move(on_mesh_dims) : std::move(allowed);
}

// The node's strategies that `wanted` accepts, where it accepts any (else all stay: the op cannot keep
// that layout, and propagation places it as usual).
template <typename Wanted>
void keep_where_possible(NodeOptions& n, const Wanted& wanted) {
  if (std::any_of(n.options.begin(), n.options.end(), wanted))
    std::erase_if(n.options, [&](const OutputSharding& d) { return !wanted(d); });
}

// Under context parallelism over a mesh dim, an attention node keeps only the strategies that shard
// its queries (argument 0: [batch, heads, sequence, head dim], or their output's gradient) along the
// sequence over that dim, where it has any.
void keep_context_parallel(NodeOptions& n, const MarkOptions& options) {
  if (!options.context_parallel_dim || sharding_rule_family(n.node->op_name()) != "attention") return;
  const auto cp = static_cast<size_t>(*options.context_parallel_dim);
  keep_where_possible(n, [&](const OutputSharding& d) { return !d.chosen.inputs.empty() && d.chosen.inputs[0][cp] == Placement(Shard(2)); });
}

// A node of a sequence-sharded module keeps only the strategies that shard each of its outputs of
// more than sequence_dim dims along it over the mesh dim (and over the context-parallel dim, which
// shards the sequence everywhere), where it has any.
void keep_sequence_sharded(NodeOptions& n, const MarkOptions& options) {
  for (const SequenceShardedModule& module : options.sequence_sharded) {
    if (!path_matches(module.module_pattern, n.node->module_path)) continue;
    std::vector<size_t> mesh_dims = {static_cast<size_t>(module.mesh_dim)};
    if (options.context_parallel_dim) mesh_dims.push_back(static_cast<size_t>(*options.context_parallel_dim));
    keep_where_possible(n, [&](const OutputSharding& d) {
      for (size_t k = 0; k < d.chosen.outputs.size() && k < n.outputs.size(); ++k)
        for (const size_t m : mesh_dims)
          if (static_cast<int64_t>(n.outputs[k]->meta.shape.size()) > module.sequence_dim &&
              d.chosen.outputs[k][m] != Placement(Shard(module.sequence_dim)))
            return false;
      return true;
    });
  }
}

// What enumerate_strategies keeps while it walks the graph in order.
struct Enumeration {
  Program& program;
  const MeshPtr& mesh;
  const MarkOptions& options;
  StrategyProblem problem;
  Placements replicate;
  std::set<const Value*> state;  // parameters, buffers and constants (and user inputs, kept in place), and views of them
  std::set<const Value*> written;
  PossiblePlacements possible;
  OptionsCache options_cache;

  Enumeration(Program& p, const MeshPtr& m, const MarkOptions& o)
      : program(p), mesh(m), options(o), problem{Marks{{}, ShardedSizes(m)}, {}, {}, StrategyChoice(m, p.annotations)},
        replicate(m->ndim(), Replicate()), written(written_values(p.graph)) {
    for (const InputSpec& spec : p.inputs)
      if (spec.kind != InputSpec::Kind::UserInput || o.keep_user_inputs_in_place) state.insert(spec.value);
  }

  // Size queries read the global shape (their local value is tracked as a DSymInt). Factories make
  // the same value on every rank, or their part of it where a size is sharded.
  void sizes_or_factory(Node* node, const Call& c, NodeSharding& s, const std::vector<Value*>& outputs) {
    Annotations& placed = program.annotations;
    problem.marks.sizes.record(*node, placed);
    s.moves.assign(c.inputs.size(), std::nullopt);
    for (Value* v : outputs) placed.set_placements(*v, replicate);
    if (outputs.empty() || !c.inputs.empty()) return;
    if (auto factory = problem.marks.sizes.factory_placements(*node)) {
      Value* out = outputs[0];
      placed.set_placements(*out, factory->first);
      const LocalLayout l = local_layout(out->meta.shape, mesh->shape(), *mesh->coordinate(), factory->first);
      s.local_args = {{factory->second, c10::IValue(l.shape)}};
      placed.set_note(*node, "makes this rank's part: a size is read from a sharded dim");
    }
  }

  // An op without a rule runs on Replicate inputs, unless the options make that an error.
  void without_rule(Node* node, const Call& c, NodeSharding& s, const std::vector<Value*>& outputs) {
    std::string sharded;
    for (const auto& in : c.inputs)
      if (!all_replicate(in.spec->placements)) sharded += (sharded.empty() ? "" : ", ") + to_string(in.spec->placements);
    if (options.fail_without_rule && !sharded.empty())
      throw DTensorError("graph: node '" + node->name + "' (" + node->op_name() + ") has no sharding rule, and inputs placed (" +
                         sharded + ") reach it; register a rule (dtensor::register_dim_rule) or place its inputs Replicate");
    s.no_rule = true;
    for (const auto& in : c.inputs) s.moves.push_back(all_replicate(in.spec->placements) ? std::nullopt : std::optional(replicate));
    for (Value* v : outputs) program.annotations.set_placements(*v, replicate);
    program.annotations.set_note(*node, "no sharding rule: runs on Replicate inputs");
  }

  // A node with a rule: its options, chosen node by node for now.
  void with_rule(Node* node, const Call& c, const NodeSharding& s, const std::vector<Value*>& outputs) {
    NodeOptions n{node, {}, outputs, {}};
    for (size_t k = 0; k < s.tensor_args.size(); ++k) n.inputs.push_back(s.list_index[k] == -2 ? nullptr : input_slot(*node, s, k));
    try {
      n.options = cached_options_for(*node->op, c, n.inputs, possible, mesh, options_cache);
    } catch (const DTensorError& e) {
      throw DTensorError("graph: node '" + node->name + "': " + e.what());
    }
    keep_allowed(n, options, state, problem.choice);
    keep_context_parallel(n, options);
    keep_sequence_sharded(n, options);
    if (n.options.empty())
      throw DTensorError("graph: node '" + node->name + "' (" + node->op_name() + "): its sharding rule offers no strategy for inputs placed " +
                         placements_of(n.inputs, program.annotations));
    for (size_t k = 0; k < s.tensor_args.size(); ++k) {
      const auto& alias = node->op->schema().arguments().at(s.tensor_args[k]).alias_info();
      n.written.push_back(alias && alias->isWrite());
    }
    n.fixed = writes_an_input(*node) || std::any_of(outputs.begin(), outputs.end(), [&](Value* v) { return written.count(v) > 0; });
    // A transposed or reshaped weight is still the weight (linear's decomposition reads t(W)).
    if (is_view_of_state(*node, state))
      for (Value* v : outputs) state.insert(v);
    for (size_t k = 0; k < outputs.size(); ++k) {
      std::set<std::string> seen;
      for (const OutputSharding& d : n.options)
        if (k < d.chosen.outputs.size() && seen.insert(to_string(d.chosen.outputs[k])).second) possible[outputs[k]].push_back(d.chosen.outputs[k]);
    }
    problem.choice.choose_greedily(n);
    problem.nodes.push_back(std::move(n));
  }

  void node(Node* node) {
    if (!node->op) {  // integer operators on sizes
      problem.marks.sizes.record(*node, program.annotations);
      return;
    }
    const auto outputs = tensor_outputs(*node);
    Call c = call_of(*node, program.annotations, mesh);
    NodeSharding& s = problem.marks.nodes[node] = std::move(c.sharding);
    if (c.inputs.empty() || outputs.empty()) sizes_or_factory(node, c, s, outputs);
    else if (!dtensor::detail::has_sharding_rule(*node->op)) without_rule(node, c, s, outputs);
    else with_rule(node, c, s, outputs);
  }

  // The graph outputs and their targets.
  void outputs() {
    const auto& graph_outputs = program.graph.outputs();
    for (size_t k = 0; k < graph_outputs.size(); ++k)
      for (Value* v : graph_outputs[k].values)
        if (v && v->is_tensor() && program.annotations.placements(*v))
          problem.needed.push_back({v, options.output_targets.empty() ? std::optional(replicate) : options.output_targets.at(k)});
  }
};

}  // namespace

// The value read by a node's strategy input k.
Value* input_slot(const Node& node, const NodeSharding& s, size_t k) {
  const Arg& a = node.args()[s.tensor_args[k]];
  return a.values[s.list_index[k] < 0 ? 0 : static_cast<size_t>(s.list_index[k])];
}


StrategyProblem enumerate_strategies(Program& program, const MeshPtr& mesh, const MarkOptions& options) {
  Enumeration e(program, mesh, options);
  for (Node* node : program.graph.nodes()) e.node(node);
  e.outputs();
  return std::move(e.problem);
}

}  // namespace dtensor::graph::detail
