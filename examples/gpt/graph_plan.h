#pragma once
// The GPT's tensor-parallel plan by module path, for the graph level: the plan of training.h (a
// vocabulary-parallel embedding, column-parallel q/k/v and fc1, row-parallel wo and fc2, a
// column-parallel LM head), with the layouts that graphs decide by propagation left out.

#include "dtensor/parallel_style.h"

namespace gpt {

inline dtensor::ParallelizePlan graph_plan(bool with_lm_head = true) {
  dtensor::ParallelizePlan plan = {{"tok_emb", dtensor::RowwiseParallel{}},
                                   {"blocks.*.attn.w[qkv]", dtensor::ColwiseParallel{}},
                                   {"blocks.*.attn.wo", dtensor::RowwiseParallel{}},
                                   {"blocks.*.mlp.fc1", dtensor::ColwiseParallel{}},
                                   {"blocks.*.mlp.fc2", dtensor::RowwiseParallel{}}};
  if (with_lm_head) plan.push_back({"lm_head", dtensor::ColwiseParallel{}});
  return plan;
}

}  // namespace gpt
