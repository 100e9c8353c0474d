#include "dtensor/graph/spmd.h"

#include <ATen/ATen.h>

#include <set>

#include "dtensor/errors.h"
#include "dtensor/layout.h"
#include "dtensor/redistribute_plan.h"
#include "pipeline.h"

namespace dtensor::graph {
namespace {

using Kind = InputSpec::Kind;

std::string names_of(const Program& program) {
  std::string out;
  for (const InputSpec& spec : program.inputs)
    if (spec.kind != Kind::UserInput) out += (out.empty() ? "" : ", ") + spec.target;
  return out;
}

// Placements checked against the mesh and the tensor, the error naming the input.
Placements checked(const Placements& p, const DeviceMesh& mesh, const Value& v, const std::string& what) {
  try {
    for (const Placement& x : p)
      if (x.is_head_tail_shard())
        throw DTensorError(x.str() + ": graph programs have no form of head-tail shards yet; place the sequence Shard (plain blocks)");
    return validate_placements(p, mesh.ndim(), static_cast<int64_t>(v.meta.shape.size()), what.c_str());
  } catch (const DTensorError& e) {
    throw DTensorError("spmd_expand: " + what + " (%" + v.name + ", shape " + shape_str(v.meta.shape) + ") on " + mesh.str() + ": " +
                       e.what());
  }
}

// The mesh sizes sharding tensor dim `d` under `p`, multiplied.
int64_t shards_of_dim(const Placements& p, const DeviceMesh& mesh, int64_t d) {
  int64_t n = 1;
  for (int64_t m = 0; m < static_cast<int64_t>(p.size()); ++m)
    if (p[m].is_shard() && p[m].dim() == d) n *= mesh.size(m);
  return n;
}

// A dynamic dim's name: "s52" for the sympy expression "Symbol('s52', positive=True, integer=True)".
std::string symbol_name(const std::string& expr) {
  const std::string prefix = "Symbol('";
  if (expr.rfind(prefix, 0) != 0) return expr;
  return expr.substr(prefix.size(), expr.find('\'', prefix.size()) - prefix.size());
}

// A dynamic dim sharded n ways must divide by n: sizes read from it are then chunks of the global.
void check_divisible(const Value& v, const Placements& p, const DeviceMesh& mesh, const Shape& shape, const std::string& what) {
  for (size_t d = 0; d < v.symbolic_sizes.size() && d < shape.size(); ++d) {
    if (v.symbolic_sizes[d].empty()) continue;
    const int64_t n = shards_of_dim(p, mesh, static_cast<int64_t>(d));
    if (shape[d] % n != 0)
      throw DTensorError(what + ": its dynamic dim " + std::to_string(d) + " (" + symbol_name(v.symbolic_sizes[d]) + ") is " +
                         std::to_string(shape[d]) + ", which " + std::to_string(n) + " shards (" + to_string(p) + " on " +
                         mesh.str() + ") do not divide; the expanded program needs it a multiple of " + std::to_string(n));
  }
}

void mark_inputs(Program& program, const DeviceMesh& mesh, const SpmdPlacements& placements) {
  const Placements replicate(mesh.ndim(), Replicate());
  const auto users = program.user_inputs();
  if (!placements.user_inputs.empty() && placements.user_inputs.size() != users.size())
    throw DTensorError("spmd_expand: " + std::to_string(placements.user_inputs.size()) + " user input placements given, but the program takes " +
                       std::to_string(users.size()) + " user inputs");
  std::set<std::string> known;
  for (const InputSpec& spec : program.inputs)
    if (spec.kind != Kind::UserInput) known.insert(spec.target);
  for (const auto& [name, p] : placements.state)
    if (!known.count(name))
      throw DTensorError("spmd_expand: placements given for '" + name + "', which is not a parameter, buffer or constant of the program (its names: " +
                         names_of(program) + ")");
  Annotations& marks = program.annotations;
  size_t user = 0;
  for (const InputSpec& spec : program.inputs) {
    Value& v = *spec.value;
    if (spec.kind == Kind::UserInput) {
      const size_t index = user++;
      const bool given = !placements.user_inputs.empty();
      if (!v.is_tensor()) {
        marks.clear_placements(v);
        continue;
      }
      const std::string what = "user input " + std::to_string(index);
      const Placements p = given ? checked(placements.user_inputs[index], mesh, v, what) : replicate;
      for (const auto& x : p)
        if (x.is_partial())
          throw DTensorError("spmd_expand: " + what + " placed " + to_string(p) +
                             ": user inputs are Shard or Replicate (a Partial input has no cut to take from a global one)");
      check_divisible(v, p, mesh, v.meta.shape, "spmd_expand: " + what + " at its example size");
      marks.set_placements(v, p);
      continue;
    }
    auto it = placements.state.find(spec.target);
    marks.set_placements(v, it == placements.state.end() ? replicate : checked(it->second, mesh, v, "'" + spec.target + "'"));
  }
}

// Where each graph output must end (see spmd.h): the caller's, a gradient as its parameter, a
// buffer mutation as its buffer; otherwise nullopt (Partial entries Replicate, shards stay).
std::vector<std::optional<Placements>> output_targets(const Program& program, const DeviceMesh& mesh, const SpmdPlacements& placements) {
  std::map<std::string, Placements> state;
  for (const InputSpec& spec : program.inputs)
    if (spec.kind != Kind::UserInput)
      if (const Placements* p = program.annotations.placements(*spec.value)) state.emplace(spec.target, *p);
  const auto& outputs = program.graph.outputs();
  std::vector<std::optional<Placements>> out(outputs.size());
  for (const auto& [index, p] : placements.outputs) {
    if (index >= outputs.size())
      throw DTensorError("spmd_expand: placements given for output " + std::to_string(index) + ", but the program has " +
                         std::to_string(outputs.size()) + " outputs");
    const Value* v = outputs[index].values.empty() ? nullptr : outputs[index].values[0];
    if (!v || !v->is_tensor()) throw DTensorError("spmd_expand: output " + std::to_string(index) + " is not a tensor; it takes no placements");
    out[index] = checked(p, mesh, *v, "output " + std::to_string(index));
  }
  for (size_t k = 0; k < outputs.size() && k < program.outputs.size(); ++k) {
    if (out[k]) continue;
    const OutputSpec& spec = program.outputs[k];
    if (spec.kind == OutputSpec::Kind::GradientToParameter || spec.kind == OutputSpec::Kind::BufferMutation)
      if (auto it = state.find(spec.target); it != state.end()) out[k] = it->second;
  }
  return out;
}

void check_joint_graph(const Program& program) {
  bool gradients = false, loss = false;
  for (const OutputSpec& spec : program.outputs) {
    gradients = gradients || spec.kind == OutputSpec::Kind::GradientToParameter || spec.kind == OutputSpec::Kind::GradientToUserInput;
    loss = loss || spec.kind == OutputSpec::Kind::LossOutput;
  }
  if (gradients && !loss)
    throw DTensorError("spmd_expand: " + (program.source.empty() ? std::string("the program") : program.source) +
                       " is a joint graph (it outputs gradients) without a LOSS_OUTPUT; export it with "
                       "torch.export.experimental._export_forward_backward(ep, joint_loss_index=...)");
}

using Search = detail::MarkOptions::Search;
Search search_of(SpmdOptions::Search s) {
  switch (s) {
    case SpmdOptions::Search::Greedy: return Search::Greedy;
    case SpmdOptions::Search::LocalSearch: return Search::LocalSearch;
    case SpmdOptions::Search::Exact: return Search::Exact;
    case SpmdOptions::Search::Auto: return Search::Auto;
  }
  return Search::Auto;
}

}  // namespace

Program spmd_expand(Program program, const MeshPtr& mesh, const SpmdPlacements& placements, const SpmdOptions& options) {
  if (!mesh) throw DTensorError("spmd_expand: the mesh is null");
  if (!mesh->coordinate())
    throw DTensorError("spmd_expand: this rank is not part of " + mesh->str() + ", so it has no program to run");
  check_joint_graph(program);
  mark_inputs(program, *mesh, placements);
  detail::MarkOptions mark{.fail_without_rule = true, .keep_state_in_place = true, .keep_user_inputs_in_place = options.keep_user_inputs_in_place};
  mark.search = search_of(options.search);
  if (!options.context_parallel_dim.empty()) mark.context_parallel_dim = mesh->dim_index(options.context_parallel_dim);
  mark.output_targets = output_targets(program, *mesh, placements);
  mark.sequence_sharded = placements.sequence_sharded;
  detail::expand_marked(program, mesh, mark);
  return program;
}

std::vector<c10::IValue> local_user_inputs(const Program& expanded, const std::vector<c10::IValue>& global_inputs) {
  if (!expanded.mesh) throw DTensorError("local_user_inputs: the program is not an expanded (per-rank) one");
  const DeviceMesh& mesh = *expanded.mesh;
  const auto users = expanded.user_inputs();
  if (global_inputs.size() != users.size())
    throw DTensorError("local_user_inputs: the program takes " + std::to_string(users.size()) + " user inputs, got " +
                       std::to_string(global_inputs.size()));
  std::vector<c10::IValue> out;
  for (size_t i = 0; i < users.size(); ++i) {
    const Value& v = *users[i];
    const Placements* placed = expanded.annotations.placements(v);
    if (!placed || !global_inputs[i].isTensor()) {
      out.push_back(global_inputs[i]);
      continue;
    }
    const at::Tensor& t = global_inputs[i].toTensor();
    const std::string what = "local_user_inputs: user input " + std::to_string(i) + " (%" + v.name + ")";
    if (t.dim() != static_cast<int64_t>(v.meta.shape.size()))
      throw DTensorError(what + " has " + std::to_string(t.dim()) + " dims; the program's has " + std::to_string(v.meta.shape.size()));
    check_divisible(v, *placed, mesh, t.sizes().vec(), what);
    const LocalLayout l = local_layout(t.sizes().vec(), mesh.shape(), *mesh.coordinate(), *placed);
    at::Tensor local = t;
    for (int64_t d = 0; d < t.dim(); ++d)
      if (l.shape[d] != t.size(d)) local = local.narrow(d, l.offset[d], l.shape[d]);
    out.emplace_back(local.contiguous());
  }
  return out;
}

std::vector<CollectiveNote> collectives(const Program& expanded) {
  std::vector<CollectiveNote> out;
  for (const Node* n : expanded.graph.nodes())
    if (n->target.find("_c10d_functional") != std::string::npos && n->op_name() != "_c10d_functional::wait_tensor")
      out.push_back({n->name, n->op_name(), expanded.annotations.note(*n), expanded.annotations.bytes_per_rank(*n)});
  return out;
}

std::string collectives_report(const Program& expanded) {
  std::string out;
  std::map<std::string, int> counts;
  int64_t bytes = 0;
  for (const CollectiveNote& c : collectives(expanded)) {
    const std::string op = c.op.substr(c.op.find("::") + 2);
    out += "  %" + c.node + "  " + op + "  " + format_bytes(static_cast<double>(c.bytes_per_rank)) + "/rank  " + c.why + "\n";
    ++counts[op];
    bytes += c.bytes_per_rank;
  }
  std::string summary;
  for (const auto& [op, n] : counts) summary += (summary.empty() ? "" : ", ") + std::to_string(n) + " " + op;
  const StrategyCosts& s = expanded.strategy_costs;
  out += "collectives: " + (summary.empty() ? std::string("none") : summary) + "; " + format_bytes(static_cast<double>(bytes)) +
         " received per rank\nstrategy choice (" + s.method + "): modelled cost " + format_bytes(s.chosen) + ", node by node " +
         format_bytes(s.node_by_node) + "\n";
  return out;
}

}  // namespace dtensor::graph
