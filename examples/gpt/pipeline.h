#pragma once
// The GPT as pipeline pieces (dtensor/pipeline_split.h), in the order its forward runs them: the
// embeddings (tokens -> hidden states), each block (or each half of one), and the head (final norm and
// LM head -> logits).
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

namespace pieces_detail {

// The steps of GptImpl::logits the pieces run.
inline at::Tensor embed_tokens(GptImpl* m, const at::Tensor& tokens) { return dtensor::call(m->tok_emb, tokens); }
inline at::Tensor add_positions(GptImpl* m, const at::Tensor& x) { return x + m->positions(x.size(1)); }
inline at::Tensor causal_mask_for(GptImpl* m, const at::Tensor& x) {
  const int64_t t = x.size(1);
  return m->causal_mask.slice(0, 0, t).slice(1, 0, t);
}

// A piece computing `f` as a forward of `owner`, the module fully_shard groups its parameters by
// (call_as_forward), so that a fully-sharded owner gathers for the piece.
inline dtensor::pipeline::ModelPiece owned_piece(std::string path, std::shared_ptr<torch::nn::Module> owner,
                                                 std::function<at::Tensor(const at::Tensor&)> f, std::vector<at::Tensor> parameters) {
  torch::nn::Module* held = owner.get();
  return {std::move(path), [held, f = std::move(f)](const at::Tensor& x) { return dtensor::call_as_forward(*held, f, x); },
          std::move(parameters), {std::move(owner)}};
}

}  // namespace pieces_detail

// The pieces by block: tok_emb (the embeddings), blocks.i, and lm_head (the final norm and the head).
inline std::vector<dtensor::pipeline::ModelPiece> pipeline_pieces(Gpt& model) {
  using namespace pieces_detail;
  GptImpl* m = model.get();
  std::vector<dtensor::pipeline::ModelPiece> pieces;
  pieces.push_back(owned_piece("tok_emb", model.ptr(), [m](const at::Tensor& t) { return add_positions(m, embed_tokens(m, t)); },
                               {m->tok_emb->weight, m->pos_emb}));
  for (size_t i = 0; i < m->blocks->size(); ++i) {
    BlockImpl* block = m->blocks[i]->as<BlockImpl>();
    pieces.push_back({"blocks." + std::to_string(i),
                      [m, block](const at::Tensor& x) { return dtensor::call(*block, x, causal_mask_for(m, x)); },
                      block->parameters(),
                      {m->blocks[i]}});
  }
  std::vector<at::Tensor> head = m->ln_f->parameters();
  head.push_back(m->lm_head->weight);
  pieces.push_back(owned_piece("lm_head", model.ptr(), [m](const at::Tensor& h) { return dtensor::call(m->lm_head, dtensor::call(m->ln_f, h)); }, head));
  return pieces;
}

// The finest pieces: tok_emb (the token embedding), pos_emb (its addition), blocks.i.attn and
// blocks.i.mlp (each half of a block with its residual), ln_f and lm_head: enough for PP=4 with two
// stages per rank on the demo's two blocks. A fully-sharded module whose pieces run apart gathers for
// each of them.
inline std::vector<dtensor::pipeline::ModelPiece> finest_pipeline_pieces(Gpt& model) {
  using namespace pieces_detail;
  GptImpl* m = model.get();
  std::vector<dtensor::pipeline::ModelPiece> pieces;
  pieces.push_back(owned_piece("tok_emb", model.ptr(), [m](const at::Tensor& t) { return embed_tokens(m, t); }, {m->tok_emb->weight}));
  pieces.push_back(owned_piece("pos_emb", model.ptr(), [m](const at::Tensor& x) { return add_positions(m, x); }, {m->pos_emb}));
  for (size_t i = 0; i < m->blocks->size(); ++i) {
    BlockImpl* block = m->blocks[i]->as<BlockImpl>();
    std::vector<at::Tensor> attention = block->ln1->parameters(), mlp = block->ln2->parameters();
    for (const at::Tensor& p : block->attn->parameters()) attention.push_back(p);
    for (const at::Tensor& p : block->mlp->parameters()) mlp.push_back(p);
    const std::string path = "blocks." + std::to_string(i);
    pieces.push_back(owned_piece(path + ".attn", m->blocks[i], [m, block](const at::Tensor& x) { return block->attend(x, causal_mask_for(m, x)); },
                                 attention));
    pieces.push_back(owned_piece(path + ".mlp", m->blocks[i], [block](const at::Tensor& h) { return block->feed_forward(h); }, mlp));
  }
  pieces.push_back(owned_piece("ln_f", model.ptr(), [m](const at::Tensor& h) { return dtensor::call(m->ln_f, h); }, m->ln_f->parameters()));
  pieces.push_back(owned_piece("lm_head", model.ptr(), [m](const at::Tensor& h) { return dtensor::call(m->lm_head, h); }, {m->lm_head->weight}));
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
