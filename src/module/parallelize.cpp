// parallelize_module: resolve each plan path (with wildcards) to submodules and apply its style.

#include <fnmatch.h>

#include "dtensor/errors.h"
#include "dtensor/parallel.h"
#include "parallel_styles.h"

namespace dtensor {
namespace {

void collect_matches(torch::nn::Module& module, const std::string& path, const std::vector<std::string>& atoms,
                     size_t depth, std::vector<std::pair<std::string, torch::nn::Module*>>& out) {
  if (depth == atoms.size()) {
    out.emplace_back(path, &module);
    return;
  }
  for (const auto& child : module.named_children())
    if (fnmatch(atoms[depth].c_str(), child.key().c_str(), 0) == 0)
      collect_matches(*child.value(), path.empty() ? child.key() : path + "." + child.key(), atoms, depth + 1, out);
}

int64_t tensor_parallel_dim(const MeshPtr& mesh, const ParallelizeOptions& options) {
  if (!options.tp_dim.empty()) return mesh->dim_index(options.tp_dim);
  if (mesh->ndim() != 1)
    throw DTensorError("parallelize_module on " + mesh->str() +
                       ": name the tensor-parallel mesh dim (ParallelizeOptions::tp_dim) on a mesh of more than one dim");
  return 0;
}

}  // namespace

std::vector<std::pair<std::string, torch::nn::Module*>> match_submodules(torch::nn::Module& root,
                                                                        const std::string& pattern) {
  std::vector<std::pair<std::string, torch::nn::Module*>> out;
  if (pattern.empty()) {
    out.emplace_back("", &root);
    return out;
  }
  collect_matches(root, "", split_plan_path(pattern), 0, out);
  return out;
}

void parallelize_module(torch::nn::Module& module, const MeshPtr& mesh, const ParallelizePlan& plan,
                        const ParallelizeOptions& options) {
  if (!mesh) throw DTensorError("parallelize_module: the mesh is null");
  const detail::StyleContext context{mesh, tensor_parallel_dim(mesh, options)};
  for (const PlanEntry& entry : plan) {
    const auto matches = match_submodules(module, entry.path);
    if (matches.empty() && entry.optional) continue;
    if (matches.empty()) {
      std::string children;
      for (const auto& child : module.named_modules("", /*include_self=*/false))
        children += (children.empty() ? "" : ", ") + child.key();
      throw DTensorError("parallelize_module: plan entry '" + entry.path + "' matches no submodule of " +
                         module.name() + " (its submodules: " + (children.empty() ? "none" : children) + ")");
    }
    for (const auto& [path, sub] : matches) detail::apply_style(context, path, *sub, entry.style);
  }
}

}  // namespace dtensor
