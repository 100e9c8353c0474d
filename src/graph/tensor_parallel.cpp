#include "dtensor/graph/tensor_parallel.h"

#include <set>

#include "dtensor/errors.h"
#include "sharding_marks.h"

namespace dtensor::graph {
namespace {

// The module type of every module path that ran a node (from nn_module_stack). Graphs without that
// metadata (joint forward+backward graphs lose it) get the owners of their weights instead: a module
// whose 2-d weight an aten::embedding reads is an Embedding, any other with a 2-d weight a Linear.
std::map<std::string, std::string> module_types(const Program& program) {
  std::map<std::string, std::string> out;
  for (const Node* n : program.graph.nodes())
    if (!n->module_path.empty()) out.emplace(n->module_path, n->module_type);
  if (!out.empty()) return out;
  std::set<const Value*> embedded;
  for (const Node* n : program.graph.nodes())
    if (n->op_name() == "aten::embedding" && !n->args.empty() && !n->args[0].values.empty()) embedded.insert(n->args[0].values[0]);
  const std::string suffix = ".weight";
  for (const InputSpec& spec : program.inputs) {
    const std::string& name = spec.target;
    if (spec.kind != InputSpec::Kind::Parameter || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0 || spec.value->meta.shape.size() != 2)
      continue;
    out.emplace(name.substr(0, name.size() - suffix.size()), embedded.count(spec.value) ? "Embedding" : "Linear");
  }
  return out;
}

bool is_type(const std::string& type, const char* name) {
  const auto dot = type.rfind('.');
  return type.substr(dot == std::string::npos ? 0 : dot + 1) == name;
}

// Seed 000's parameter placements, with embeddings read as module-level styles read them.
std::map<std::string, Placement> parameter_placements(const Program& program, const ParallelizePlan& plan) {
  const auto types = module_types(program);
  std::map<std::string, Placement> out;
  for (const PlanEntry& entry : plan) {
    const bool colwise = std::holds_alternative<ColwiseParallel>(entry.style);
    if (!colwise && !std::holds_alternative<RowwiseParallel>(entry.style))
      throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path +
                         "': only ColwiseParallel and RowwiseParallel apply to graphs");
    std::vector<std::string> matched;
    for (const auto& [path, type] : types)
      if (path_matches(entry.path, path)) matched.push_back(path);
    if (matched.empty()) {
      std::string known;
      for (const auto& [path, type] : types) known += (known.empty() ? "" : ", ") + path;
      throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path + "' matches no module of the program " +
                         "(its modules: " + known + ")");
    }
    for (const std::string& path : matched) {
      const std::string& type = types.at(path);
      const std::string weight = path + ".weight", bias = path + ".bias";
      if (!program.state.count(weight))
        throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path + "' matches " + path + " (" + type +
                           "), which has no parameter " + weight);
      if (is_type(type, "Linear")) {
        out.insert_or_assign(weight, colwise ? Shard(0) : Shard(1));
        if (program.state.count(bias)) out.insert_or_assign(bias, colwise ? Shard(0) : Replicate());
      } else if (is_type(type, "Embedding")) {
        // Row-parallel shards the vocabulary; column-parallel the embedding dim (as module level).
        out.insert_or_assign(weight, colwise ? Shard(1) : Shard(0));
      } else {
        throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path + "' matches " + path + ", a " + type +
                           "; graph-level styles apply to Linear and Embedding modules");
      }
    }
  }
  return out;
}

int64_t tp_dim_of(const DeviceMesh& mesh, const GraphParallelOptions& options) {
  if (!options.tp_dim.empty()) return mesh.dim_index(options.tp_dim);
  if (mesh.ndim() != 1)
    throw DTensorError("tensor_parallel_transform on " + mesh.str() +
                       ": name the tensor-parallel mesh dim (GraphParallelOptions::tp_dim) on a mesh of more than one dim");
  return 0;
}

}  // namespace

std::map<std::string, Placements> plan_placements(const Program& program, const DeviceMesh& mesh, const ParallelizePlan& plan,
                                                  const GraphParallelOptions& options) {
  const int64_t tp = tp_dim_of(mesh, options);
  std::map<std::string, Placements> out;
  for (const auto& [name, placement] : parameter_placements(program, plan)) {
    Placements p(mesh.ndim(), Replicate());
    p[tp] = placement;
    out.emplace(name, p);
  }
  return out;
}

Program tensor_parallel_transform(Program program, const MeshPtr& mesh, const ParallelizePlan& plan,
                                  const GraphParallelOptions& options) {
  if (!mesh) throw DTensorError("tensor_parallel_transform: the mesh is null");
  if (!mesh->coordinate())
    throw DTensorError("tensor_parallel_transform: this rank is not part of " + mesh->str() + ", so it has no program to run");
  const int64_t tp = tp_dim_of(*mesh, options);
  const auto params = plan_placements(program, *mesh, plan, options);
  const Placements replicate(mesh->ndim(), Replicate());
  for (const InputSpec& spec : program.inputs) {
    auto it = params.find(spec.target);
    spec.value->placements = spec.kind != InputSpec::Kind::UserInput && it != params.end() ? it->second : replicate;
  }
  // The plan's weights stay sharded as planned (never gathered), and only the tensor-parallel mesh dim
  // shards anything: the other dims hold replicas.
  detail::expand_marked(program, mesh, {.keep_state_in_place = true, .only_mesh_dim = tp});
  return program;
}

}  // namespace dtensor::graph
