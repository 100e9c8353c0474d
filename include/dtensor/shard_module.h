#pragma once
// Sharding plans (PyTorch's torch.distributed._shard API, seed 004) over DTensors. A ChunkShardingSpec
// "chunk along `dim` over these ranks" is Shard(dim) on a 1-d mesh whose coordinates are those ranks,
// so a sharded parameter is an ordinary DTensor: every op, redistribute and optimizer work on it.
//
// The process group is a 1-d DeviceMesh. Where one is not given, the one a LoadProcessGroupGuard set
// is used.

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "dtensor/module.h"

namespace dtensor {

struct ChunkShardingSpec {
  int64_t dim = 0;
  std::vector<int64_t> ranks;  // global ranks in chunk order: ranks[i] holds chunk i
  bool operator==(const ChunkShardingSpec&) const = default;
  std::string str() const;  // "ChunkShardingSpec(dim=0, ranks=[0, 1])"
};

// Shards a whole submodule its own way. C++ modules are held by their parents' member variables, which
// a replacement module would not reach, so a Sharder changes the module in place (its parameters,
// forward hooks) instead of returning a new one as PyTorch's does.
class Sharder {
 public:
  virtual ~Sharder() = default;
  virtual void shard(const std::string& path, torch::nn::Module& module, const MeshPtr& process_group) = 0;
};

struct ShardingPlan {
  // Parameter path ("fc1.weight") -> spec, or submodule path -> Sharder.
  std::vector<std::pair<std::string, std::variant<ChunkShardingSpec, std::shared_ptr<Sharder>>>> plan;
  // Submodule path -> how its DTensor output is resharded (the same ranks, another dim).
  std::vector<std::pair<std::string, ChunkShardingSpec>> output_plan;
  // Submodules whose DTensor output is returned as this rank's local shard (a sharded dim of size 1
  // squeezed away).
  std::vector<std::string> return_local_tensor;
};

// `tensor` as held by src_rank (the truth, broadcast from there), chunked as `spec`. Every rank of the
// process group calls it; they must agree on src_rank and spec (the error names the rank that differs).
at::Tensor shard_tensor(const at::Tensor& tensor, const ChunkShardingSpec& spec, int64_t src_rank = 0,
                        MeshPtr process_group = nullptr);

// Replaces parameter `name` of `module` with its shards (see shard_tensor); it must exist and be
// contiguous.
void shard_parameter(torch::nn::Module& module, const std::string& name, const ChunkShardingSpec& spec,
                     int64_t src_rank = 0, MeshPtr process_group = nullptr);

// Applies a plan: shards the parameters, runs the Sharders, installs the output hooks (they run when
// the submodule is called through dtensor::call). A parameter spec inside a Sharder's submodule is a
// conflict and an error.
void shard_module(torch::nn::Module& module, const ShardingPlan& plan, int64_t src_rank = 0,
                  MeshPtr process_group = nullptr);

// The process group shard_* functions (and loading) use when given none, for a scope. Nesting one
// guard inside another is refused.
class LoadProcessGroupGuard {
 public:
  explicit LoadProcessGroupGuard(MeshPtr process_group);
  ~LoadProcessGroupGuard();
  LoadProcessGroupGuard(const LoadProcessGroupGuard&) = delete;
  LoadProcessGroupGuard& operator=(const LoadProcessGroupGuard&) = delete;
  // The group set by the active guard, or null.
  static MeshPtr current();
};

}  // namespace dtensor
