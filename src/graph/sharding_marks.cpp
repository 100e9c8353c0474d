#include "sharding_marks.h"

#include <set>

#include "graph_forms.h"
#include "reshard.h"

namespace dtensor::graph::detail {
namespace {

// The node reads `v` for its strategy input k instead.
void set_input(Graph& graph, Node& node, const NodeSharding& s, size_t k, Value* v) {
  Arg a = node.args[s.tensor_args[k]];
  a.values[s.list_index[k] < 0 ? 0 : static_cast<size_t>(s.list_index[k])] = v;
  graph.set_arg(&node, s.tensor_args[k], std::move(a));
}

// Views' local kernel only refuses a shard that cannot be viewed; the op itself does that too.
bool only_checks(const Node& node) {
  const std::string name = node.op_name();
  return name == "aten::view" || name == "aten::_unsafe_view";
}

bool has_symbol(const Arg& a) {
  return std::any_of(a.sizes.begin(), a.sizes.end(), [](const SymSize& s) { return s.symbol != nullptr; });
}

c10::IValue global_hints(const Arg& a) {
  std::vector<int64_t> sizes;
  for (const SymSize& s : a.sizes) sizes.push_back(s.hint());
  return a.kind == Arg::Kind::SymInts ? c10::IValue(sizes) : c10::IValue(sizes.at(0));
}

}  // namespace

Marks write_moves(StrategyProblem& p) {
  for (NodeOptions& n : p.nodes) {
    NodeSharding& s = p.marks.nodes.at(n.node);
    const OutputSharding& d = n.options[n.chosen];
    for (size_t k = 0; k < n.inputs.size(); ++k)
      s.moves.push_back(n.inputs[k] && p.choice.at(n.inputs[k]) != d.chosen.inputs[k] ? std::optional(d.chosen.inputs[k]) : std::nullopt);
    s.local_args = d.local_args;
    s.local_kernel = d.local_kernel;
    s.graph_form = d.graph_form;
  }
  return std::move(p.marks);
}

void partition(Program& program, const MeshPtr& mesh, Marks& all_marks, const std::vector<std::optional<Placements>>& output_targets) {
  auto& marks = all_marks.nodes;
  Annotations& placed = program.annotations;
  // Every marked value takes its local meta; the global one stays known for planning reshards.
  std::map<const Value*, TensorMeta> global;
  auto localize = [&](Value* v) {
    const Placements* at = v->is_tensor() ? placed.placements(*v) : nullptr;
    if (!at || global.count(v)) return;
    global[v] = v->meta;
    const Shape shape = local_shape(v->meta.shape, mesh->shape(), *mesh->coordinate(), *at);
    v->meta = TensorMeta{shape, global_stride_like(shape, v->meta.shape, v->meta.stride), v->meta.dtype};
  };
  for (Value* v : program.graph.inputs()) localize(v);
  for (Node* n : program.graph.nodes())
    for (Value* v : n->outputs) localize(v);
  all_marks.sizes.compute_local_hints(program.graph);

  std::map<std::pair<const Value*, std::string>, Value*> reshards;  // one per value and target
  auto moved = [&](Node* before, Value* v, const Placements& to, const std::string& why) {
    auto& slot = reshards[{v, to_string(to)}];
    if (!slot) {
      slot = insert_reshard(program, mesh, before, v, global.at(v), to, why);
      global[slot] = global.at(v);  // a reshard moves the value, its global meta stays (lowerings read it)
    }
    return slot;
  };
  for (Node* node : program.graph.nodes()) {
    auto it = marks.find(node);
    if (it == marks.end()) continue;
    NodeSharding& s = it->second;
    for (size_t k = 0; k < s.moves.size(); ++k) {
      if (!s.moves[k] || s.list_index[k] == -2) continue;
      Value* in = input_slot(*node, s, k);
      set_input(program.graph, *node, s, k,
                moved(node, in, *s.moves[k], "for " + node->name + ": " + placed.placements_str(*in) + " -> " + to_string(*s.moves[k])));
    }
    std::set<size_t> localized;
    for (const auto& [index, value] : s.local_args) {
      all_marks.sizes.localize_argument(program, node, index, value);
      localized.insert(index);
    }
    // Sizes computed at run time that no rule made local: the op wants their global values.
    for (size_t index = 0; index < node->args.size(); ++index)
      if (!localized.count(index) && has_symbol(node->args[index]))
        all_marks.sizes.localize_argument(program, node, index, global_hints(node->args[index]));
    if (!s.local_kernel || only_checks(*node)) continue;
    if (s.graph_form) {
      for (const auto& [old_value, by] : write_graph_form(program, mesh, node, s.graph_form)) global[by] = global.at(old_value);
    } else {
      node->local_kernel = s.local_kernel;
      placed.append_note(*node, "runs dtensor's local kernel");
    }
  }
  auto& outputs = program.graph.outputs();
  for (size_t k = 0; k < outputs.size(); ++k)
    for (Value*& v : outputs[k].values) {
      const Placements* at = v && v->is_tensor() ? placed.placements(*v) : nullptr;
      if (!at) continue;
      const Placements from = *at;
      Placements target = from;
      if (output_targets.empty()) target.assign(target.size(), Replicate());
      else if (output_targets.at(k)) target = *output_targets[k];
      else
        target = partial_as_replicate(target);
      if (target != from)
        v = moved(nullptr, v, target, "graph output " + std::to_string(k) + ": " + to_string(from) + " -> " + to_string(target));
    }
}

}  // namespace dtensor::graph::detail
