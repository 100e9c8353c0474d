#pragma once
// Hugging Face tensor-parallel plans as transformers writes them, for graph-level parallelism
// (tensor_parallel.h, spmd.h): {"model.layers.*.self_attn.q_proj": "colwise", ...}, the form of
// `model.tp_plan` and of a config's `base_model_tp_plan`.
//
//   auto plan = dtensor::graph::hugging_face_plan(read_file("tp_plan.json"));
//   auto local = dtensor::graph::tensor_parallel_transform(std::move(program), mesh, plan);
//
// Each style transformers 5.24 registers is mapped to what it means for a graph, or refused with an
// error that names it:
//   colwise, colwise_rep, colwise_gather_output   ColwiseParallel (the graph's outputs are Replicate
//                                                 whatever the layout, so these three shard alike)
//   rowwise, rowwise_rep, rowwise_split_input     RowwiseParallel
//   embedding_rowwise / embedding_colwise         RowwiseParallel / ColwiseParallel on an Embedding
//   packed_colwise                                ColwiseParallel{.packed = 2}: gate and up fused
//   replicate, replicated_with_grad_allreduce,    no entry: parameters a graph plan does not name are
//   all_reduce                                    Replicate, their gradients reduced over the mesh and a
//                                                 partial module output reduced where propagation needs
//   moe_tp_experts                                no entry: the experts' own entries shard their weights
//   sequence_parallel                             SequenceParallel: the module's values Shard(1)
//   ep_dispatch_experts                           ExpertParallel: the experts module spread over the
//                                                 mesh dim (module level; graph transforms refuse it yet)
//   grouped_gemm                                  no entry: the experts' weights, which the experts
//                                                 module's ep_dispatch_experts entry spreads
//   packed_rowwise, local_params, mla_kv_a_proj, moe_identity_expert: refused, no mapping yet.
// Wildcards are transformers' ("layers.*.mlp"), which are dtensor's. An unknown style is an error
// naming it and the entry. Entries are PlanEntry::optional: one that matches no module of the program
// is skipped, as transformers skips it (the transform notes it on the program), unless `strict`.

#include <string>

#include "dtensor/parallel_style.h"

namespace dtensor::graph {

// `json_text`: a JSON object of module path -> style name, or a config (an object holding
// "base_model_tp_plan" (hugging_face_ep_plan: "base_model_ep_plan") or "model_type"; no plan there is
// an empty plan), whose paths are relative to
// the base model and get `base_model_prefix` + "." in front ("model" for Llama-like models,
// "transformer" for GPT-2). `source` names the text in errors (a file name).
ParallelizePlan hugging_face_plan(const std::string& json_text, const std::string& base_model_prefix = "",
                                  const std::string& source = "the Hugging Face plan", bool strict = false);
// The expert-parallel plan (`model.ep_plan`, a config's `base_model_ep_plan`), read as above; apply it
// with parallelize_module on the ep mesh (dim: ParallelizeOptions::tp_dim).
ParallelizePlan hugging_face_ep_plan(const std::string& json_text, const std::string& base_model_prefix = "",
                                     const std::string& source = "the Hugging Face expert-parallel plan", bool strict = false);

}  // namespace dtensor::graph
