#include "pipeline.h"

#include "batched_matmul.h"
#include "bucketing.h"
#include "fused_backward.h"
#include "dtensor/errors.h"

namespace dtensor::graph::detail {
namespace {

void shard_state(PassContext& c) {
  for (const InputSpec& spec : c.program.inputs) {
    if (spec.kind == InputSpec::Kind::UserInput) continue;
    auto& state = c.program.state.at(spec.target);
    state = StateTensor(state.shard(*c.mesh, c.program.annotations.placements_of(*spec.value)));
  }
}

}  // namespace

void Pipeline::run(PassContext& context, const std::function<void(const std::string&, const Program&)>& after) const {
  for (const Pass& pass : passes_) {
    pass.run(context);
    if (const std::string wrong = context.program.graph.check_uses(); !wrong.empty())
      throw DTensorError("internal: after graph pass '" + pass.name + "', " + wrong);
    if (after) after(pass.name, context.program);
  }
}

Pipeline spmd_pipeline() {
  return Pipeline({
      {"fold_backward", [](PassContext& c) { fold_decomposed_backward(c.program.graph); }},
      {"lift_batch_matmuls", [](PassContext& c) { lift_merged_batch_matmuls(c.program.graph); }},
      {"mark", [](PassContext& c) { c.marks = mark_sharding(c.program, c.mesh, c.options); }},
      {"partition", [](PassContext& c) { partition(c.program, c.mesh, c.marks, c.options.output_targets); }},
      {"bucket", [](PassContext& c) { coalesce_output_all_reduces(c.program); }},
      {"shard_state", shard_state},
  });
}

void expand_marked(Program& program, const MeshPtr& mesh, const MarkOptions& options) {
  program.mesh = mesh;
  PassContext context{program, mesh, options};
  spmd_pipeline().run(context);
  program.strategy_costs = context.marks.costs;
}

}  // namespace dtensor::graph::detail
