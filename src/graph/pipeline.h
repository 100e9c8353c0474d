#pragma once
// The passes a graph transform runs, in order, over one program: each pass is a function of the
// program and what earlier passes found (PassContext), so a new pass is one function in its own file,
// added where it belongs in a pipeline. tensor_parallel_transform and spmd_expand run the SPMD
// pipeline with their own MarkOptions.
//
// After every pass the graph's use-lists are checked against its nodes (Graph::check_uses): a pass
// that rewired an argument behind the graph's back fails there, naming itself.

#include <functional>
#include <string>
#include <vector>

#include "sharding_marks.h"

namespace dtensor::graph::detail {

struct PassContext {
  Program& program;
  MeshPtr mesh;
  MarkOptions options;
  Marks marks{{}, ShardedSizes(mesh)};  // mark's result, which partition consumes
};

struct Pass {
  std::string name;
  std::function<void(PassContext&)> run;
};

class Pipeline {
 public:
  explicit Pipeline(std::vector<Pass> passes) : passes_(std::move(passes)) {}
  // `after` (optional) sees the program after each pass: golden tests, debugging.
  void run(PassContext& context, const std::function<void(const std::string& pass, const Program&)>& after = {}) const;
  const std::vector<Pass>& passes() const { return passes_; }

 private:
  std::vector<Pass> passes_;
};

// The expansion of a program whose inputs are marked, into this rank's program:
//  - fold_backward: decomposed layer norm, softmax and GELU backward folded into ATen's fused
//    kernels (fused_backward.h);
//  - lift_batch_matmuls: bmm over merged dims lifted to 4-d matmuls (batched_matmul.h);
//  - mark: every node's strategy (mark_sharding);
//  - partition: reshards, local arguments and kernels, local shapes (to options.output_targets);
//  - bucket: the output all-reduces joined (bucketing.h);
//  - shard_state: each rank reads only its part of every state tensor.
// The program's mesh and strategy_costs are set.
Pipeline spmd_pipeline();

// Runs spmd_pipeline() on `program`.
void expand_marked(Program& program, const MeshPtr& mesh, const MarkOptions& options);

}  // namespace dtensor::graph::detail
