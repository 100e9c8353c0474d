#pragma once
// A GPT-style decoder written as ordinary LibTorch modules: token embedding, learned positions, N
// blocks of (layer norm, causal multi-head attention, layer norm, MLP or mixture of experts) with residuals, a final norm
// and an LM head. forward(tokens, targets) returns the mean next-token cross-entropy.
//
// Submodules are called through dtensor::call, which is plain forward() for a module without hooks:
// the same code runs on one device and under a tensor-parallel plan. The head count is never written
// into a view (-1), so attention also runs on a rank's local heads when the projections hand back
// local tensors.

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>

#include "dtensor/module.h"
#include "dtensor/moe.h"

namespace gpt {

struct Config {
  int64_t vocab = 64;
  int64_t seq_len = 32;
  int64_t dim = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t ffn = 256;
  // Attention by scaled_dot_product_attention (is_causal) in a submodule of its own (attn.kernel), and
  // learned positions read through a position_ids buffer: how a model that runs context parallel is
  // written (dtensor/context_parallel.h shards that buffer with the tokens, and the plan gives the
  // kernel module its style). Otherwise the masked softmax, which the benchmarks' baselines mirror.
  bool fused_attention = false;
  // A mixture of experts in place of each block's MLP (dtensor::MoE, transformers' layout): this many
  // SwiGLU experts of moe_intermediate features, each token routed to its top moe_top_k (0: the MLP).
  int64_t moe_experts = 0;
  int64_t moe_top_k = 2;
  int64_t moe_intermediate = 128;
};

// Causal attention of q, k, v [batch, heads, positions, head dim], as one op.
class CausalAttentionKernelImpl : public torch::nn::Module {
 public:
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  }
};
TORCH_MODULE(CausalAttentionKernel);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const Config& c)
      : head_dim_(c.dim / c.heads),
        wq(register_module("wq", torch::nn::Linear(c.dim, c.dim))),
        wk(register_module("wk", torch::nn::Linear(c.dim, c.dim))),
        wv(register_module("wv", torch::nn::Linear(c.dim, c.dim))),
        wo(register_module("wo", torch::nn::Linear(c.dim, c.dim))) {
    if (c.fused_attention) kernel = register_module("kernel", CausalAttentionKernel());
  }

  // x: [batch, seq, dim]; causal_mask: [seq, seq], 0 where a position may attend, a large negative
  // number where it may not.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& causal_mask) {
    const int64_t b = x.size(0), t = x.size(1);
    auto heads = [&](const at::Tensor& y) { return y.view({b, t, -1, head_dim_}).transpose(1, 2); };
    const at::Tensor q = heads(dtensor::call(wq, x)), k = heads(dtensor::call(wk, x)), v = heads(dtensor::call(wv, x));
    if (kernel) return dtensor::call(wo, dtensor::call(kernel, q, k, v).transpose(1, 2).reshape({b, t, -1}));
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(head_dim_)));
    const at::Tensor attention = at::softmax(scores + causal_mask, -1);
    const at::Tensor y = at::matmul(attention, v).transpose(1, 2).reshape({b, t, -1});
    return dtensor::call(wo, y);
  }

 private:
  int64_t head_dim_;

 public:
  torch::nn::Linear wq, wk, wv, wo;
  CausalAttentionKernel kernel{nullptr};  // with fused attention
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const Config& c)
      : fc1(register_module("fc1", torch::nn::Linear(c.dim, c.ffn))),
        fc2(register_module("fc2", torch::nn::Linear(c.ffn, c.dim))) {}
  at::Tensor forward(const at::Tensor& x) { return dtensor::call(fc2, at::gelu(dtensor::call(fc1, x))); }

  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

inline dtensor::MoEOptions moe_options(const Config& c) {
  dtensor::MoEOptions o;
  o.hidden = c.dim;
  o.intermediate = c.moe_intermediate;
  o.experts = c.moe_experts;
  o.top_k = c.moe_top_k;
  o.normalize_top_k = true;  // Mixtral's routing
  return o;
}

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const Config& c)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        attn(register_module("attn", Attention(c))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))) {
    if (c.moe_experts > 0) moe = register_module("moe", dtensor::MoE(moe_options(c)));
    else mlp = register_module("mlp", Mlp(c));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& causal_mask) { return feed_forward(attend(x, causal_mask)); }
  // The block's halves, each with its residual (pipeline stages may hold one each).
  at::Tensor attend(const at::Tensor& x, const at::Tensor& causal_mask) { return x + dtensor::call(attn, dtensor::call(ln1, x), causal_mask); }
  at::Tensor feed_forward(const at::Tensor& h) {
    const at::Tensor x = dtensor::call(ln2, h);
    return h + (moe ? dtensor::call(moe, x) : dtensor::call(mlp, x));
  }

  torch::nn::LayerNorm ln1;
  Attention attn;
  torch::nn::LayerNorm ln2;
  Mlp mlp{nullptr};
  dtensor::MoE moe{nullptr};  // in place of the MLP with Config::moe_experts
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const Config& c)
      : tok_emb(register_module("tok_emb", torch::nn::Embedding(c.vocab, c.dim))),
        pos_emb(register_parameter("pos_emb", at::randn({c.seq_len, c.dim}) * 0.02)),
        causal_mask(register_buffer("causal_mask", at::triu(at::full({c.seq_len, c.seq_len}, -1e9), 1))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        lm_head(register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.vocab).bias(false)))) {
    for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(Block(c));
    if (c.fused_attention) position_ids = register_buffer("position_ids", at::arange(c.seq_len, at::kLong));
    dtensor::register_tensor_members<GptImpl>(
        {{"pos_emb", &GptImpl::pos_emb}, {"causal_mask", &GptImpl::causal_mask}, {"position_ids", &GptImpl::position_ids}});
  }

  // tokens, targets: [batch, seq] token ids; the next-token cross-entropy averaged over all positions.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& targets) {
    return torch::nn::functional::cross_entropy(logits(tokens).flatten(0, 1), targets.flatten(0, 1));
  }

  // The position embeddings of `t` tokens: the first t positions', or, with position ids, theirs (a
  // context-parallel rank's positions, while the ContextParallel scope shards the buffer).
  at::Tensor positions(int64_t t) {
    return position_ids.defined() ? pos_emb.index_select(0, position_ids.slice(0, 0, t)) : pos_emb.slice(0, 0, t);
  }

  // tokens: [batch, seq] token ids; the logits [batch, seq, vocab].
  at::Tensor logits(const at::Tensor& tokens) {
    const int64_t t = tokens.size(1);
    at::Tensor x = dtensor::call(tok_emb, tokens) + positions(t);
    const at::Tensor mask = causal_mask.slice(0, 0, t).slice(1, 0, t);
    for (const auto& block : *blocks) x = dtensor::call(*block->as<BlockImpl>(), x, mask);
    return dtensor::call(lm_head, dtensor::call(ln_f, x));
  }

  torch::nn::Embedding tok_emb;
  at::Tensor pos_emb;
  at::Tensor causal_mask;
  at::Tensor position_ids;  // with fused attention: the positions of the tokens given (all, or a context-parallel rank's)
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear lm_head;
};
TORCH_MODULE(Gpt);

}  // namespace gpt
