#include "pipeline.h"

#include "batched_matmul.h"
#include "bucketing.h"
#include "experts_fusion.h"
#include "fused_backward.h"
#include "dtensor/errors.h"

namespace dtensor::graph::detail {
namespace {

void shard_state(Program& program, const DeviceMesh& mesh) {
  for (const InputSpec& spec : program.inputs) {
    if (spec.kind == InputSpec::Kind::UserInput) continue;
    auto& state = program.state.at(spec.target);
    state = StateTensor(state.shard(mesh, program.annotations.placements_of(*spec.value)));
  }
}

}  // namespace

void Pipeline::run(Program& program, const std::function<void(const std::string&, const Program&)>& after) const {
  for (const Pass& pass : passes_) {
    pass.run(program);
    if (const std::string wrong = program.graph.verify(); !wrong.empty())
      throw DTensorError("internal: after graph pass '" + pass.name + "', " + wrong);
    if (after) after(pass.name, program);
  }
}

Pipeline spmd_pipeline(SpmdExpansion& e) {
  return Pipeline({
      {"fuse_spread_experts", [](Program& p) { fuse_spread_experts(p); }},
      {"fold_backward", [](Program& p) { fold_decomposed_backward(p.graph); }},
      {"lift_batch_matmuls", [](Program& p) { lift_merged_batch_matmuls(p.graph); }},
      {"enumerate_strategies", [&e](Program& p) { e.problem.emplace(enumerate_strategies(p, e.mesh, e.options)); }},
      {"solve", [&e](Program&) { solve(*e.problem, e.options.search); }},
      {"write_moves", [&e](Program&) {
         e.marks = write_moves(*e.problem);
         e.problem.reset();
       }},
      {"partition", [&e](Program& p) { partition(p, e.mesh, e.marks, e.options.output_targets); }},
      {"bucket", [](Program& p) { coalesce_output_all_reduces(p); }},
      {"shard_state", [&e](Program& p) { shard_state(p, *e.mesh); }},
  });
}

void expand_marked(Program& program, const MeshPtr& mesh, const MarkOptions& options) {
  program.mesh = mesh;
  SpmdExpansion expansion{mesh, options};
  spmd_pipeline(expansion).run(program);
  program.strategy_costs = expansion.marks.costs;
}

}  // namespace dtensor::graph::detail
