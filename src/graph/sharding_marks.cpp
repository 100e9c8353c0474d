#include "sharding_marks.h"

#include <set>

#include "graph_forms.h"
#include "reshard.h"

namespace dtensor::graph::detail {
namespace {

// Views' local kernel only refuses a shard that cannot be viewed; the op itself does that too, and
// keeps the view's symbolic sizes as the graph localized them.
bool only_checks(const Node& node) {
  const std::string name = node.op_name();
  return name == "aten::view" || name == "aten::_unsafe_view";
}

// The node reads `v` for its strategy input k instead.
void set_input(Graph& graph, Node& node, const NodeSharding& s, size_t k, Value* v) {
  Arg a = node.args()[s.tensor_args[k]];
  a.values[s.list_index[k] < 0 ? 0 : static_cast<size_t>(s.list_index[k])] = v;
  graph.set_arg(&node, s.tensor_args[k], std::move(a));
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

namespace {

// partition's state: the reshards made so far.
struct Partitioner {
  Program& program;
  const MeshPtr& mesh;
  Marks& marks;
  std::map<std::pair<const Value*, std::string>, Value*> reshards;  // one per value and target

  // Every marked value takes its local meta; the global one goes to the annotations, for planning
  // reshards.
  void localize_values() {
    auto localize = [&](Value* v) {
      const Placements* at = v->is_tensor() ? program.annotations.placements(*v) : nullptr;
      if (!at || program.annotations.global_meta(*v)) return;
      program.annotations.set_global_meta(*v, v->meta);
      const Shape shape = local_shape(v->meta.shape, mesh->shape(), *mesh->coordinate(), *at);
      v->meta = TensorMeta{shape, global_stride_like(shape, v->meta.shape, v->meta.stride), v->meta.dtype};
    };
    for (Value* v : program.graph.inputs()) localize(v);
    for (Node* n : program.graph.nodes())
      for (Value* v : n->outputs) localize(v);
    marks.sizes.compute_local_hints(program.graph);
  }

  Value* moved(Node* before, Value* v, const Placements& to, const std::string& why) {
    auto& slot = reshards[{v, to_string(to)}];
    if (!slot) {
      const TensorMeta global = program.annotations.global_meta_of(*v);
      slot = insert_reshard(program, mesh, before, v, global, to, why);
      program.annotations.set_global_meta(*slot, global);  // a reshard moves the value, its global meta stays
    }
    return slot;
  }

  // Local sizes: what the rule asked for, and the global values of sizes computed at run time that
  // no rule made local (the op wants those).
  void localize_arguments(Node* node, const NodeSharding& s) {
    std::set<size_t> localized;
    for (const auto& [index, value] : s.local_args) {
      marks.sizes.localize_argument(program, node, index, value);
      localized.insert(index);
    }
    for (size_t index = 0; index < node->args().size(); ++index)
      if (!localized.count(index) && has_symbol(node->args()[index]))
        marks.sizes.localize_argument(program, node, index, global_hints(node->args()[index]));
  }

  void node(Node* node, NodeSharding& s) {
    for (size_t k = 0; k < s.moves.size(); ++k) {
      if (!s.moves[k] || s.list_index[k] == -2) continue;
      Value* in = input_slot(*node, s, k);
      const std::string why = "for " + node->name + ": " + program.annotations.placements_str(*in) + " -> " + to_string(*s.moves[k]);
      set_input(program.graph, *node, s, k, moved(node, in, *s.moves[k], why));
    }
    localize_arguments(node, s);
    if (!s.local_kernel || only_checks(*node)) return;
    if (s.graph_form) {
      for (const auto& [old_value, by] : write_graph_form(program, mesh, node, s.graph_form))
        program.annotations.set_global_meta(*by, program.annotations.global_meta_of(*old_value));
    } else {
      program.annotations.set_local_kernel(*node, s.local_kernel);
      program.annotations.append_note(*node, "runs dtensor's local kernel");
    }
  }

  void outputs(const std::vector<std::optional<Placements>>& targets) {
    Graph& graph = program.graph;
    for (size_t k = 0; k < graph.outputs().size(); ++k) {
      Arg output = graph.outputs()[k];
      for (Value*& v : output.values) {
        const Placements* at = v && v->is_tensor() ? program.annotations.placements(*v) : nullptr;
        if (!at) continue;
        const Placements from = *at;
        Placements target = from;
        if (targets.empty()) target.assign(target.size(), Replicate());
        else if (targets.at(k)) target = *targets[k];
        else
          target = partial_as_replicate(target);
        if (target != from)
          v = moved(nullptr, v, target, "graph output " + std::to_string(k) + ": " + to_string(from) + " -> " + to_string(target));
      }
      graph.set_output(k, std::move(output));
    }
  }
};

}  // namespace

void partition(Program& program, const MeshPtr& mesh, Marks& marks, const std::vector<std::optional<Placements>>& output_targets) {
  Partitioner p{program, mesh, marks, {}};
  p.localize_values();
  for (Node* node : program.graph.nodes())
    if (auto it = marks.nodes.find(node); it != marks.nodes.end()) p.node(node, it->second);
  p.outputs(output_targets);
}

}  // namespace dtensor::graph::detail
