#pragma once
// The GPT as pipeline pieces (dtensor/pipeline_split.h), in the order its forward runs them: the
// embeddings (tokens -> hidden states), each block, and the head (final norm and LM head -> logits).
// The loss is the next-token cross-entropy of the last stage's logits. Modules are called as
// GptImpl::logits calls them (dtensor::call), so that a tensor-parallel plan's hooks run in each stage;
// each piece names the module fully_shard groups its parameters by (training.h's fully_shard: the
// root's for the embeddings and the head, each block's own).

#include <torch/nn/functional/loss.h>

#include "dtensor/api.h"
#include "dtensor/fsdp.h"
#include "dtensor/pipeline_split.h"
#include "gpt_model.h"

namespace gpt {

inline std::vector<dtensor::pipeline::ModelPiece> pipeline_pieces(Gpt& model) {
  GptImpl* m = model.get();
  std::vector<dtensor::pipeline::ModelPiece> pieces;
  pieces.push_back({"tok_emb",
                    [m](const at::Tensor& tokens) {
                      return dtensor::call_as_forward(
                          *m, [m](const at::Tensor& t) { return dtensor::call(m->tok_emb, t) + m->pos_emb.slice(0, 0, t.size(1)); }, tokens);
                    },
                    {m->tok_emb->weight, m->pos_emb},
                    {model.ptr()}});
  for (size_t i = 0; i < m->blocks->size(); ++i) {
    BlockImpl* block = m->blocks[i]->as<BlockImpl>();
    pieces.push_back({"blocks." + std::to_string(i),
                      [m, block](const at::Tensor& x) {
                        const int64_t t = x.size(1);
                        return dtensor::call(*block, x, m->causal_mask.slice(0, 0, t).slice(1, 0, t));
                      },
                      block->parameters(),
                      {m->blocks[i]}});
  }
  std::vector<at::Tensor> head = m->ln_f->parameters();
  head.push_back(m->lm_head->weight);
  pieces.push_back({"lm_head",
                    [m](const at::Tensor& x) {
                      return dtensor::call_as_forward(
                          *m, [m](const at::Tensor& h) { return dtensor::call(m->lm_head, dtensor::call(m->ln_f, h)); }, x);
                    },
                    head,
                    {model.ptr()}});
  return pieces;
}

// Under TP the logits are a DTensor sharded by class (loss parallel); the targets then join them as
// Replicate, as the TP plan's root input does in the whole model.
inline at::Tensor pipeline_loss(const at::Tensor& logits, const at::Tensor& targets) {
  const at::Tensor aligned =
      dtensor::is_dtensor(logits)
          ? dtensor::from_local(targets, dtensor::mesh_of(logits), dtensor::Placements(dtensor::placements_of(logits).size(), dtensor::Replicate()))
          : targets;
  return torch::nn::functional::cross_entropy(logits.flatten(0, 1), aligned.flatten(0, 1));
}

}  // namespace gpt
