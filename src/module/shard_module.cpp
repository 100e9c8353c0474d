// The sharding-plan API on DTensors: a chunk spec becomes Shard(dim) on a 1-d mesh over its ranks.

#include <map>
#include <mutex>

#include "../mesh/collectives.h"
#include "dtensor/api.h"
#include "dtensor/errors.h"
#include "dtensor/layout.h"
#include "dtensor/shard_module.h"
#include "dtensor/world.h"

namespace dtensor {
namespace {

thread_local MeshPtr load_process_group;

std::string ranks_str(const std::vector<int64_t>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

MeshPtr resolve_group(MeshPtr group, const char* what) {
  if (!group) group = LoadProcessGroupGuard::current();
  if (!group)
    throw DTensorError(std::string(what) + ": no process group given and no LoadProcessGroupGuard active; pass a 1-d "
                                           "DeviceMesh over the ranks that take part");
  if (group->ndim() != 1)
    throw DTensorError(std::string(what) + ": the process group must be a 1-d DeviceMesh, not " + group->str());
  return group;
}

int64_t position_in(const MeshPtr& group, int64_t rank, const std::string& what) {
  const auto& ranks = group->ranks();
  const auto it = std::find(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end()) throw DTensorError(what + ": rank " + std::to_string(rank) + " is not in " + group->str());
  return it - ranks.begin();
}

// Every member's (src_rank, spec), checked against this rank's: PyTorch's all_gather_object check.
void require_agreement(const MeshPtr& group, int64_t src_rank, const ChunkShardingSpec& spec) {
  const int64_t me = group->world()->rank();
  const auto lengths = detail::all_gather_values(*group, 0, {static_cast<int64_t>(spec.ranks.size())});
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<int64_t> record = {src_rank, spec.dim, static_cast<int64_t>(spec.ranks.size())};
  record.insert(record.end(), spec.ranks.begin(), spec.ranks.end());
  record.resize(3 + longest, -1);
  const auto all = detail::all_gather_values(*group, 0, record);
  for (int64_t i = 0; i < group->size(); ++i) {
    const int64_t* theirs = all.data() + i * record.size();
    const int64_t other = group->ranks()[i];
    if (theirs[0] != src_rank)
      throw DTensorError("src_rank=" + std::to_string(src_rank) + " on rank " + std::to_string(me) +
                         " does not match src_rank=" + std::to_string(theirs[0]) + " on rank " + std::to_string(other) +
                         "; every rank must pass the same src_rank");
    const ChunkShardingSpec their_spec{theirs[1], std::vector<int64_t>(theirs + 3, theirs + 3 + theirs[2])};
    if (their_spec != spec)
      throw DTensorError("sharding spec " + spec.str() + " on rank " + std::to_string(me) + " does not match " +
                         their_spec.str() + " on rank " + std::to_string(other) + "; every rank must pass the same spec");
  }
}

// The 1-d mesh whose coordinates are the spec's ranks (the group itself when they coincide). A mesh is
// reused while the tensors sharded on it live, so sharding many parameters the same way builds one
// set of process groups; the map holds it weakly, so it goes (groups and all) with its last tensor.
// (Every rank shards alike and drops its tensors alike, so all of them reuse or rebuild together.)
MeshPtr mesh_for(const MeshPtr& group, const ChunkShardingSpec& spec) {
  if (spec.ranks == group->ranks()) return group;
  static std::mutex mutex;
  static std::map<std::pair<const World*, std::vector<int64_t>>, std::weak_ptr<const DeviceMesh>> meshes;
  std::lock_guard<std::mutex> lock(mutex);
  std::weak_ptr<const DeviceMesh>& slot = meshes[{group->world().get(), spec.ranks}];
  if (MeshPtr mesh = slot.lock()) return mesh;
  MeshPtr mesh = DeviceMesh::create(group->world(), {static_cast<int64_t>(spec.ranks.size())}, spec.ranks,
                                    {.timeout = group->timeout()});
  slot = mesh;
  return mesh;
}

}  // namespace

std::string ChunkShardingSpec::str() const {
  return "ChunkShardingSpec(dim=" + std::to_string(dim) + ", ranks=" + ranks_str(ranks) + ")";
}

LoadProcessGroupGuard::LoadProcessGroupGuard(MeshPtr process_group) {
  if (load_process_group)
    throw DTensorError("LoadProcessGroupGuard: a process group is already set by an enclosing guard (" +
                       load_process_group->str() + "); guards do not nest");
  if (!process_group) throw DTensorError("LoadProcessGroupGuard: the process group is null");
  load_process_group = std::move(process_group);
}
LoadProcessGroupGuard::~LoadProcessGroupGuard() { load_process_group = nullptr; }
MeshPtr LoadProcessGroupGuard::current() { return load_process_group; }

at::Tensor shard_tensor(const at::Tensor& tensor, const ChunkShardingSpec& spec, int64_t src_rank,
                        MeshPtr process_group) {
  const MeshPtr group = resolve_group(std::move(process_group), "shard_tensor");
  if (!tensor.is_contiguous()) throw DTensorError("shard_tensor: the input tensor is not contiguous");
  if (spec.ranks.empty()) throw DTensorError("shard_tensor: " + spec.str() + " lists no ranks");
  const int64_t src = position_in(group, src_rank, "shard_tensor(src_rank)");
  for (int64_t r : spec.ranks) position_in(group, r, "shard_tensor(" + spec.str() + ")");
  require_agreement(group, src_rank, spec);
  const Placements placements = validate_placements({Shard(spec.dim)}, 1, tensor.dim(), "shard_tensor");

  at::Tensor truth = tensor.detach().clone();
  detail::broadcast_(*group, 0, truth, src);
  const MeshPtr mesh = mesh_for(group, spec);
  const Shape shape = tensor.sizes().vec();
  at::Tensor local;
  if (mesh->contains_this_rank()) {
    const LocalLayout part = local_layout(shape, mesh->shape(), *mesh->coordinate(), placements);
    local = truth.narrow(placements[0].dim(), part.offset[placements[0].dim()], part.shape[placements[0].dim()]).clone();
  } else {
    local = truth.narrow(placements[0].dim(), 0, 0);  // ranks outside the spec hold nothing
  }
  at::Tensor out = from_local(local, mesh, placements, {.run_check = false, .shape = shape, .stride = contiguous_strides(shape)});
  if (tensor.requires_grad()) out.set_requires_grad(true);
  return out;
}

void shard_parameter(torch::nn::Module& module, const std::string& name, const ChunkShardingSpec& spec,
                     int64_t src_rank, MeshPtr process_group) {
  const at::Tensor& param = parameter_of(module, name, module.name() + "." + name);
  if (!param.is_contiguous()) throw DTensorError("shard_parameter: parameter " + name + " is not contiguous");
  set_dtensor_parameter(module, name, shard_tensor(param, spec, src_rank, std::move(process_group)), name);
}

namespace {

// "a.b" is inside "a" (and "a" inside itself), but "ab" is not inside "a".
bool inside(const std::string& path, const std::string& module_path) {
  return path == module_path || (path.size() > module_path.size() && path.compare(0, module_path.size(), module_path) == 0 &&
                                 path[module_path.size()] == '.');
}

torch::nn::Module& submodule(torch::nn::Module& root, const std::string& path) {
  if (path.empty()) return root;
  const auto modules = root.named_modules();
  const auto* found = modules.find(path);
  if (!found)
    throw DTensorError("shard_module: " + root.name() + " has no submodule '" + path + "'");
  return **found;
}

void reshard_output(torch::nn::Module& module, const std::string& path, const ChunkShardingSpec& spec) {
  register_forward_hook(module, [path, spec](torch::nn::Module&, at::Tensor out) {
    if (!is_dtensor(out)) return out;
    if (mesh_of(out)->ranks() != spec.ranks)
      throw DTensorError("output_plan for '" + path + "': the output lives on " + mesh_of(out)->str() + " but " +
                         spec.str() + " names other ranks; resharding across meshes is not supported");
    return redistribute(out, {Shard(spec.dim)});
  });
}

void collect_local_shard(torch::nn::Module& module) {
  register_forward_hook(module, [](torch::nn::Module&, at::Tensor out) {
    if (!is_dtensor(out)) return out;
    at::Tensor local = to_local(out);
    const Placements& placements = placements_of(out);
    if (placements.size() == 1 && placements[0].is_shard() && local.dim() > 0 && local.size(placements[0].dim()) == 1)
      local = local.squeeze(placements[0].dim());
    return local;
  });
}

}  // namespace

void shard_module(torch::nn::Module& module, const ShardingPlan& plan, int64_t src_rank, MeshPtr process_group) {
  const MeshPtr group = resolve_group(std::move(process_group), "shard_module");
  std::vector<std::string> sharder_paths;
  for (const auto& [path, entry] : plan.plan)
    if (std::holds_alternative<std::shared_ptr<Sharder>>(entry)) {
      if (path.empty()) throw DTensorError("shard_module: a custom Sharder needs a non-empty module path");
      sharder_paths.push_back(path);
    }
  for (const auto& [path, entry] : plan.plan) {
    if (const auto* spec = std::get_if<ChunkShardingSpec>(&entry)) {
      const size_t dot = path.rfind('.');
      const std::string module_path = dot == std::string::npos ? "" : path.substr(0, dot);
      const std::string name = dot == std::string::npos ? path : path.substr(dot + 1);
      for (const auto& sharder_path : sharder_paths)
        if (inside(module_path, sharder_path))
          throw DTensorError("ShardingPlan is invalid: it shards parameter " + path +
                             " but a Sharder already handles module '" + sharder_path +
                             "'; parameter specs must not reach into a Sharder's submodule tree");
      torch::nn::Module& owner = submodule(module, module_path);
      const at::Tensor& param = parameter_of(owner, name, path);
      if (!param.is_contiguous()) throw DTensorError("shard_module: parameter " + path + " is not contiguous");
      set_dtensor_parameter(owner, name, shard_tensor(param, *spec, src_rank, group), path);
    } else {
      std::get<std::shared_ptr<Sharder>>(entry)->shard(path, submodule(module, path), group);
    }
  }
  for (const auto& [path, spec] : plan.output_plan) reshard_output(submodule(module, path), path, spec);
  for (const auto& path : plan.return_local_tensor) collect_local_shard(submodule(module, path));
}

}  // namespace dtensor
