#pragma once
// Transformers' sequence_parallel style on Llama's norms (Megatron's sequence parallelism), and how
// many of a program's norm values it left sharded along the sequence: shared by the graph tests of
// tensor parallelism and of context parallelism.

#include <string>
#include <utility>

#include "../harness.h"
#include "dtensor/graph/hugging_face.h"
#include "dtensor/graph/program.h"

namespace dtensor::testing {

// `plan` with every norm of a Llama (each layer's two, the final one) sequence_parallel, as a
// transformers plan writes it.
inline ParallelizePlan with_sequence_parallel_norms(ParallelizePlan plan) {
  for (PlanEntry& e : graph::hugging_face_plan(R"({"model.layers.*.input_layernorm": "sequence_parallel",
      "model.layers.*.post_attention_layernorm": "sequence_parallel", "model.norm": "sequence_parallel"})"))
    plan.push_back(std::move(e));
  return plan;
}

// How many node outputs of `program` (of two dims or more) in a norm module there are, and how many of
// them are Shard(1) over mesh dim `tp`.
inline std::pair<int, int> norm_outputs_on_sequence_shards(const graph::Program& program, size_t tp) {
  int outputs = 0, sharded = 0;
  for (const graph::Node* node : program.graph.nodes()) {
    if (node->module_path.find("norm") == std::string::npos) continue;
    for (const graph::Value* v : node->outputs) {
      const Placements* p = program.annotations.placements(*v);
      if (!p || v->meta.shape.size() < 2) continue;
      ++outputs;
      sharded += (*p)[tp] == Placement(Shard(1));
    }
  }
  return {outputs, sharded};
}

}  // namespace dtensor::testing
