#pragma once
// Passes over a program, run in order by a Pipeline: each pass is a named function of the program, so
// a new pass is one function in its own file, added at its place in a pipeline's table. What a
// transform's passes hand each other (its mesh and options, the strategy problem) lives in the
// transform's own state, which its passes capture; the pipeline knows only programs, as torch.fx's
// and MLIR's pass managers know only graphs and operations.
//
// After every pass the graph is verified (Graph::verify): a pass that made a node read a value before
// it is defined fails there, naming itself.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sharding_marks.h"

namespace dtensor::graph::detail {

struct Pass {
  std::string name;
  std::function<void(Program&)> run;
};

class Pipeline {
 public:
  explicit Pipeline(std::vector<Pass> passes) : passes_(std::move(passes)) {}
  // `after` (optional) sees the program after each pass: golden tests, debugging.
  void run(Program& program, const std::function<void(const std::string& pass, const Program&)>& after = {}) const;
  const std::vector<Pass>& passes() const { return passes_; }

 private:
  std::vector<Pass> passes_;
};

// What the SPMD passes hand each other.
struct SpmdExpansion {
  MeshPtr mesh;
  MarkOptions options;
  std::optional<StrategyProblem> problem;  // from enumerate_strategies to write_moves
  Marks marks{{}, ShardedSizes(mesh)};     // write_moves' result, which partition consumes
};

// The expansion of a program whose inputs are marked, into this rank's program, as `expansion` asks:
//  - fuse_spread_experts: experts whose weights are placed Shard(0) become dtensor's experts ops, so
//    that expert parallelism is among the strategies (experts_fusion.h);
//  - fold_backward: decomposed layer norm, softmax and GELU backward folded into ATen's fused
//    kernels (fused_backward.h);
//  - lift_batch_matmuls: bmm over merged dims lifted to 4-d matmuls (batched_matmul.h);
//  - enumerate_strategies: every node's options, values placed by the node-by-node choice;
//  - solve: the whole graph's choice (options.search), values placed as chosen;
//  - write_moves: per node, the moves, local arguments and kernels of its choice;
//  - partition: reshards, local arguments and kernels, local shapes (to options.output_targets);
//  - bucket: the output all-reduces joined (bucketing.h);
//  - shard_state: each rank reads only its part of every state tensor.
Pipeline spmd_pipeline(SpmdExpansion& expansion);

// Runs spmd_pipeline() on `program`; sets its mesh and strategy_costs.
void expand_marked(Program& program, const MeshPtr& mesh, const MarkOptions& options);

}  // namespace dtensor::graph::detail
