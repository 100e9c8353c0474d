#include "dtensor/graph/tensor_parallel.h"

#include <algorithm>
#include <set>

#include "dtensor/errors.h"
#include "module_kinds.h"
#include "pipeline.h"

namespace dtensor::graph {
namespace {

using detail::ModuleInfo;
using detail::ModuleKind;

// Whether a column-parallel projection keeps its shard: an output split into heads is sharded by
// whole heads, so `heads` must divide over the ranks. Fewer heads than ranks (grouped-query attention's
// KV projections with fewer KV heads than ranks) are replicated instead, as Megatron and vLLM do: each
// rank computes every KV head (a small layer) and its attention takes the heads its queries need
// without a collective. Any other count cannot be spread.
bool shards_by_heads(const std::string& entry, const std::string& path, const ModuleInfo& info, int64_t ranks) {
  if (!info.heads || *info.heads % ranks == 0) return true;
  if (ranks % *info.heads == 0) return false;
  throw DTensorError("tensor_parallel_transform: plan entry '" + entry + "' shards " + path + ", whose output is " +
                     std::to_string(*info.heads) + " heads, over " + std::to_string(ranks) +
                     " ranks: the heads cannot be spread (neither divides the other); use a tensor-parallel size that divides " +
                     std::to_string(*info.heads) + " or is a multiple of it, or leave " + path + " out of the plan to replicate it");
}

// The program's modules that plan path `pattern` names.
std::vector<std::string> modules_named(const std::map<std::string, ModuleInfo>& modules, const std::string& pattern) {
  std::vector<std::string> matched;
  for (const auto& [path, info] : modules)
    if (path_matches(pattern, path)) matched.push_back(path);
  return matched;
}

// The modules plan entry `entry` names; none is an error listing them all, unless the entry is optional.
std::vector<std::string> matched_modules(const std::map<std::string, ModuleInfo>& modules, const PlanEntry& entry) {
  std::vector<std::string> matched = modules_named(modules, entry.path);
  if (matched.empty() && !entry.optional) {
    std::string known;
    for (const auto& [path, info] : modules) known += (known.empty() ? "" : ", ") + path;
    throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path + "' matches no module of the program " + "(its modules: " +
                       known + ")");
  }
  return matched;
}

// ExpertParallel: the experts' 3-d weights ([experts, ...]) of the modules `entry` names, Shard(0),
// whole experts per rank (they then run as dtensor's experts ops: src/graph/experts_fusion.h). Modules
// are read from the weights' names, which joint programs keep where they lose module paths.
void spread_experts(const Program& program, const PlanEntry& entry, int64_t ranks, std::map<std::string, Placement>& out) {
  int found = 0;
  for (const auto& [name, state] : program.state) {
    const std::string module = name.substr(0, name.rfind('.'));
    const Shape& shape = state.meta().shape;
    if (shape.size() != 3 || module.size() == name.size() || !path_matches(entry.path, module)) continue;
    if (shape[0] % ranks != 0)
      throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path + "' (ExpertParallel) spreads the " +
                         std::to_string(shape[0]) + " experts of " + module + " over " + std::to_string(ranks) +
                         " ranks: they do not divide; use an expert-parallel size that divides " + std::to_string(shape[0]));
    out.insert_or_assign(name, Shard(0));
    ++found;
  }
  if (found == 0 && !entry.optional)
    throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path +
                       "' (ExpertParallel) matches no module holding experts' 3-d weights [experts, out, in]");
}

// Seed 000's parameter placements, with each module sharded as what it is (module_kinds.h): a Linear's
// weight is [out, in], a Conv1D's [in, out], an Embedding's [vocabulary, dim] (row-parallel shards the
// vocabulary, column-parallel the embedding dim, as module-level styles do).
std::map<std::string, Placement> parameter_placements(const Program& program, const ParallelizePlan& plan, int64_t ranks) {
  const auto modules = detail::program_modules(program);
  std::map<std::string, Placement> out;
  for (const PlanEntry& entry : plan) {
    if (std::holds_alternative<SequenceParallel>(entry.style)) continue;  // its parameters stay Replicate
    if (std::holds_alternative<ExpertParallel>(entry.style)) {
      spread_experts(program, entry, ranks, out);
      continue;
    }
    const auto* colwise = std::get_if<ColwiseParallel>(&entry.style);
    if (!colwise && !std::holds_alternative<RowwiseParallel>(entry.style))
      throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path +
                         "': only ColwiseParallel, RowwiseParallel, SequenceParallel and ExpertParallel apply to graphs");
    const int64_t packed = colwise ? colwise->packed : 1;
    for (const std::string& path : matched_modules(modules, entry)) {
      const ModuleInfo& info = modules.at(path);
      const std::string what = path + (info.type.empty() ? "" : " (" + info.type + ")");
      if (!info.weight)
        throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path + "' matches " + what +
                           ", which has no parameter " + path + ".weight");
      const std::string& weight = info.weight_name;
      if (info.kind == ModuleKind::Other)
        throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path + "' matches " + what +
                           ", whose weight no Linear, Conv1D or Embedding reads: graph-level styles apply to those layers only "
                           "(and to experts' 3-d weights, selected by index before a batched multiply)");
      if (packed != 1 && info.kind == ModuleKind::Embedding)
        throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path + "' packs " + what +
                           ", an Embedding: packing applies to Linear and Conv1D layers");
      const bool has_bias = program.state.count(info.bias_name) > 0;
      if (info.kind == ModuleKind::Embedding) {
        out.insert_or_assign(weight, colwise ? Shard(1) : Shard(0));
        continue;
      }
      const detail::FeatureDims dims = detail::feature_dims(info.kind);
      // A bias holds the output features last: [out], or an expert's [expert, out].
      const bool experts = info.kind == ModuleKind::ExpertsLinear || info.kind == ModuleKind::ExpertsConv1D;
      const int64_t bias_dim = experts ? 1 : 0;
      if (colwise) {
        if (packed == 1 && !shards_by_heads(entry.path, path, info, ranks)) continue;
        out.insert_or_assign(weight, StridedShard(dims.out, packed));
        if (has_bias) out.insert_or_assign(info.bias_name, StridedShard(bias_dim, packed));
      } else {
        out.insert_or_assign(weight, Shard(dims.in));
        if (has_bias) out.insert_or_assign(info.bias_name, Replicate());
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
  for (const auto& [name, placement] : parameter_placements(program, plan, mesh.size(tp))) {
    Placements p(mesh.ndim(), Replicate());
    p[tp] = placement;
    out.emplace(name, p);
  }
  return out;
}

std::vector<SequenceShardedModule> plan_sequence_parallel(const Program& program, const DeviceMesh& mesh, const ParallelizePlan& plan,
                                                          const GraphParallelOptions& options) {
  const int64_t tp = tp_dim_of(mesh, options);
  const auto modules = detail::program_modules(program);
  std::vector<SequenceShardedModule> out;
  for (const PlanEntry& entry : plan)
    if (const auto* sequence = std::get_if<SequenceParallel>(&entry.style)) {
      const std::vector<std::string> matched = matched_modules(modules, entry);
      if (matched.empty()) continue;  // optional
      const auto nodes = program.graph.nodes();
      if (std::none_of(nodes.begin(), nodes.end(), [&](const Node* n) { return path_matches(entry.path, n->module_path); }))
        throw DTensorError("tensor_parallel_transform: plan entry '" + entry.path + "' (SequenceParallel) names " + matched.front() +
                           (matched.size() > 1 ? " and " + std::to_string(matched.size() - 1) + " more" : "") +
                           ", but no node of the program records that it ran in them (a joint program from "
                           "_export_forward_backward keeps no module paths): export the training IR to place activations by module");
      out.push_back({entry.path, tp, sequence->sequence_dim});
    }
  return out;
}

std::vector<std::string> unmatched_plan_entries(const Program& program, const ParallelizePlan& plan) {
  const auto modules = detail::program_modules(program);
  std::vector<std::string> out;
  for (const PlanEntry& entry : plan)
    if (modules_named(modules, entry.path).empty()) out.push_back(entry.path);
  return out;
}

Program tensor_parallel_transform(Program program, const MeshPtr& mesh, const ParallelizePlan& plan,
                                  const GraphParallelOptions& options) {
  if (!mesh) throw DTensorError("tensor_parallel_transform: the mesh is null");
  if (!mesh->coordinate())
    throw DTensorError("tensor_parallel_transform: this rank is not part of " + mesh->str() + ", so it has no program to run");
  const int64_t tp = tp_dim_of(*mesh, options);
  const auto params = plan_placements(program, *mesh, plan, options);
  for (const std::string& entry : unmatched_plan_entries(program, plan))
    program.annotations.add_program_note("plan entry '" + entry + "' matches no module of the program: skipped");
  const Placements replicate(mesh->ndim(), Replicate());
  for (const InputSpec& spec : program.inputs) {
    auto it = params.find(spec.target);
    program.annotations.set_placements(*spec.value, spec.kind != InputSpec::Kind::UserInput && it != params.end() ? it->second : replicate);
  }
  // The plan's weights stay sharded as planned (never gathered), and only the tensor-parallel mesh dim
  // shards anything: the other dims hold replicas.
  detail::expand_marked(program, mesh,
                        {.keep_state_in_place = true, .only_mesh_dim = tp, .sequence_sharded = plan_sequence_parallel(program, *mesh, plan, options)});
  return program;
}

}  // namespace dtensor::graph
