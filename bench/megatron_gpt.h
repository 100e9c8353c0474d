#pragma once
// The GPT demo model (examples/gpt) under hand-written Megatron-style tensor parallelism: each rank's
// shards of the same weights as plain tensors, Megatron's f/g autograd functions over raw c10d
// all-reduces, a vocabulary-parallel embedding and cross-entropy. The baseline the benchmarks hold
// dtensor against (bench/tp_step_bench.cpp: training steps; bench/graph_bench.cpp: forward).

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpt/gpt_model.h"

namespace megatron {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The tensor-parallel group of this process, and the all-reduces it ran (by what they were for). A
// process-wide handle, as Megatron's parallel_state keeps it: the autograd Functions below reach it
// from backward.
struct TpGroup {
  c10::intrusive_ptr<c10d::Backend> backend;
  int64_t rank = 0;
  int64_t size = 1;
  std::map<std::string, int64_t> all_reduces;
  int64_t all_reduce_bytes = 0;
  // The model's all-reduces return at once, leaving partial values: per-rank compute alone, the bound
  // on what tensor parallelism can gain with free communication (tp_step_bench sets it per step).
  bool skip_all_reduces = false;
};

inline TpGroup& tp_group() {
  static TpGroup group;
  return group;
}

// In place. Skipped on one rank, as Megatron does.
inline void all_reduce_(at::Tensor& t, c10d::ReduceOp op, const char* purpose) {
  TpGroup& group = tp_group();
  if (group.size == 1 || group.skip_all_reduces) return;
  ++group.all_reduces[purpose];
  group.all_reduce_bytes += static_cast<int64_t>(t.nbytes());
  std::vector<at::Tensor> tensors{t};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  group.backend->allreduce(tensors, options)->wait();
}

// Megatron's f, in front of a column-parallel layer: identity forward, all-reduce of the gradient
// backward (each rank's layer saw only its shard of the outputs).
struct CopyToTensorParallel : torch::autograd::Function<CopyToTensorParallel> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x) { return x; }
  static variable_list backward(AutogradContext*, variable_list grads) {
    at::Tensor grad = grads[0].contiguous();  // a fresh gradient: reduced in place, as Megatron does
    all_reduce_(grad, c10d::ReduceOp::SUM, "f backward (input gradient of q/k/v, fc1, LM head)");
    return {grad};
  }
};

// Megatron's g, behind a row-parallel layer or the vocabulary-parallel embedding: all-reduce forward
// (the partial sums), identity backward.
struct ReduceFromTensorParallel : torch::autograd::Function<ReduceFromTensorParallel> {
  // `partial` is a fresh result nothing else holds: reduced in place (marked dirty), as Megatron does.
  static at::Tensor forward(AutogradContext* ctx, at::Tensor partial, const char* purpose) {
    all_reduce_(partial, c10d::ReduceOp::SUM, purpose);
    ctx->mark_dirty({partial});
    return partial;
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

inline at::Tensor copy_to_tp(const at::Tensor& x) { return CopyToTensorParallel::apply(x); }
inline at::Tensor reduce_from_tp(const at::Tensor& partial, const char* purpose) {
  return ReduceFromTensorParallel::apply(partial, purpose);
}

// [start, end) of a dim of `size` that `rank` of `ranks` holds, split with torch.chunk semantics (as
// dtensor's Shard does).
struct Range {
  int64_t start, end;
  int64_t length() const { return end - start; }
};

inline Range chunk_range(int64_t size, int64_t rank, int64_t ranks) {
  const int64_t chunk = (size + ranks - 1) / ranks;
  const int64_t start = std::min(rank * chunk, size);
  return {start, std::min(start + chunk, size)};
}

// A trainable copy of this rank's chunk of `full` along `dim`.
inline at::Tensor shard_of(const at::Tensor& full, int64_t dim) {
  const TpGroup& group = tp_group();
  const Range r = chunk_range(full.size(dim), group.rank, group.size);
  if (r.length() == 0)
    throw std::invalid_argument("dim " + std::to_string(dim) + " of size " + std::to_string(full.size(dim)) +
                                " leaves rank " + std::to_string(group.rank) + " an empty shard");
  return full.detach().narrow(dim, r.start, r.length()).clone(at::MemoryFormat::Contiguous).requires_grad_();
}

inline at::Tensor replica_of(const at::Tensor& full) { return full.detach().clone().requires_grad_(); }

// Megatron's vocabulary-parallel cross-entropy over class-sharded logits [rows, local classes]: the
// row max (all-reduce MAX), the target logit (all-reduce SUM: only its owner contributes) and the sum
// of exponentials (all-reduce SUM) make the loss without gathering the logits; the gradient, softmax
// minus one-hot on the local classes, needs no communication.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            int64_t vocab_start) {
    at::Tensor max = logits.amax(-1);
    all_reduce_(max, c10d::ReduceOp::MAX, "cross-entropy row max");
    const at::Tensor shifted = logits - max.unsqueeze(-1);

    const at::Tensor here = (targets >= vocab_start) & (targets < vocab_start + logits.size(-1));
    const at::Tensor local_targets = at::where(here, targets - vocab_start, 0).unsqueeze(-1);
    at::Tensor target_logit = shifted.gather(-1, local_targets).squeeze(-1).masked_fill(here.logical_not(), 0);
    all_reduce_(target_logit, c10d::ReduceOp::SUM, "cross-entropy target logit");

    at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = exp.sum(-1);
    all_reduce_(sum_exp, c10d::ReduceOp::SUM, "cross-entropy sum of exponentials");

    ctx->save_for_backward({exp.div_(sum_exp.unsqueeze(-1)), local_targets, here});
    return (sum_exp.log() - target_logit).mean();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0];  // the softmax, needed only here: turned into the gradient in place
    const at::Tensor &local_targets = saved[1], &here = saved[2];
    grad.scatter_add_(-1, local_targets, here.to(grad.scalar_type()).neg().unsqueeze(-1));
    grad.mul_(grads[0] / grad.size(0));
    return {grad, at::Tensor(), at::Tensor()};
  }
};

struct LinearShard {
  at::Tensor weight, bias;
};

// Output features split: rows of the weight and the bias.
inline LinearShard column_shard(const torch::nn::Linear& full) { return {shard_of(full->weight, 0), shard_of(full->bias, 0)}; }

// Input features split: columns of the weight; the bias is added once, after the reduction.
inline LinearShard row_shard(const torch::nn::Linear& full) { return {shard_of(full->weight, 1), replica_of(full->bias)}; }

struct Norm {
  at::Tensor weight, bias;
  double eps;
  explicit Norm(const torch::nn::LayerNorm& full)
      : weight(replica_of(full->weight)), bias(replica_of(full->bias)), eps(full->options.eps()) {}
  at::Tensor operator()(const at::Tensor& x) const { return at::layer_norm(x, {weight.size(0)}, weight, bias, eps); }
};

// A column-parallel layer: aten::linear (one addmm over the flattened input), the kernels dtensor's
// Linear runs on its shards and exported programs run.
inline at::Tensor linear(const at::Tensor& x, const LinearShard& layer) { return at::linear(x, layer.weight, layer.bias); }

// A row-parallel layer's partial products are summed over the group before its bias is added once.
inline at::Tensor row_parallel(const at::Tensor& x, const LinearShard& layer, const char* purpose) {
  return reduce_from_tp(at::linear(x, layer.weight), purpose) + layer.bias;
}

struct BlockShard {
  Norm ln1;
  LinearShard wq, wk, wv, wo;  // this rank's heads
  Norm ln2;
  LinearShard fc1, fc2;

  explicit BlockShard(const gpt::BlockImpl& full)
      : ln1(full.ln1),
        wq(column_shard(full.attn->wq)),
        wk(column_shard(full.attn->wk)),
        wv(column_shard(full.attn->wv)),
        wo(row_shard(full.attn->wo)),
        ln2(full.ln2),
        fc1(column_shard(full.mlp->fc1)),
        fc2(row_shard(full.mlp->fc2)) {}
};

// gpt::Gpt as this rank's shards in plain tensors, computing what gpt::Gpt::forward does.
class MegatronGpt {
 public:
  MegatronGpt(const gpt::Gpt& full, const gpt::Config& config)
      : head_dim_(config.dim / config.heads),
        vocab_size_(config.vocab),
        vocab_(chunk_range(config.vocab, tp_group().rank, tp_group().size)),
        tok_emb_(shard_of(full->tok_emb->weight, 0)),
        pos_emb_(replica_of(full->pos_emb)),
        causal_mask_(full->causal_mask.clone()),
        ln_f_(full->ln_f),
        lm_head_(shard_of(full->lm_head->weight, 0)) {
    for (const auto& block : *full->blocks) blocks_.emplace_back(*block->as<gpt::BlockImpl>());
  }

  // The residual stream after the last block (replicated on every rank).
  at::Tensor trunk(const at::Tensor& tokens) const {
    const int64_t t = tokens.size(1);
    at::Tensor x = embed(tokens) + pos_emb_.slice(0, 0, t);
    const at::Tensor mask = causal_mask_.slice(0, 0, t).slice(1, 0, t);
    for (const BlockShard& block : blocks_) {
      const at::Tensor h = x + attention(block, block.ln1(x), mask);
      x = h + mlp(block, block.ln2(h));
    }
    return x;
  }

  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& targets) const {
    const at::Tensor logits = at::linear(copy_to_tp(ln_f_(trunk(tokens))), lm_head_);  // this rank's classes
    return VocabParallelCrossEntropy::apply(logits.flatten(0, 1), targets.flatten(0, 1), vocab_.start);
  }

  // The whole logits [batch, seq, vocab] on every rank: this rank's classes, gathered (Megatron's
  // gather_from_tensor_model_parallel_region; uneven class shards travel padded).
  at::Tensor logits(const at::Tensor& tokens) const {
    const at::Tensor mine = at::linear(ln_f_(trunk(tokens)), lm_head_);
    TpGroup& group = tp_group();
    if (group.size == 1) return mine;
    const int64_t padded = (vocab_size_ + group.size - 1) / group.size;
    at::Tensor rows = at::constant_pad_nd(mine.movedim(-1, 0), {0, 0, 0, 0, 0, padded - mine.size(-1)}).contiguous();
    at::Tensor all = at::empty({padded * group.size, rows.size(1), rows.size(2)}, rows.options());
    group.backend->_allgather_base(all, rows)->wait();
    std::vector<at::Tensor> pieces;
    for (int64_t r = 0; r < group.size; ++r) pieces.push_back(all.narrow(0, r * padded, chunk_range(vocab_size_, r, group.size).length()));
    return at::cat(pieces, 0).movedim(0, -1).contiguous();
  }

  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> out = {tok_emb_, pos_emb_, ln_f_.weight, ln_f_.bias, lm_head_};
    for (const BlockShard& b : blocks_)
      out.insert(out.end(), {b.ln1.weight, b.ln1.bias, b.wq.weight, b.wq.bias, b.wk.weight, b.wk.bias, b.wv.weight,
                             b.wv.bias, b.wo.weight, b.wo.bias, b.ln2.weight, b.ln2.bias, b.fc1.weight, b.fc1.bias,
                             b.fc2.weight, b.fc2.bias});
    return out;
  }

 private:
  // Vocabulary-parallel lookup: each rank looks up the tokens in its rows, zeros for the others, and
  // the lookups add up.
  at::Tensor embed(const at::Tensor& tokens) const {
    const at::Tensor here = (tokens >= vocab_.start) & (tokens < vocab_.end);
    const at::Tensor rows = at::embedding(tok_emb_, at::where(here, tokens - vocab_.start, 0));
    return reduce_from_tp(rows.masked_fill(here.logical_not().unsqueeze(-1), 0), "embedding output");
  }

  // As gpt::AttentionImpl::forward, on this rank's heads.
  at::Tensor attention(const BlockShard& b, const at::Tensor& x, const at::Tensor& causal_mask) const {
    const int64_t batch = x.size(0), t = x.size(1);
    auto heads = [&](const at::Tensor& y) { return y.view({batch, t, -1, head_dim_}).transpose(1, 2); };
    const at::Tensor in = copy_to_tp(x);  // one for q, k and v: one gradient all-reduce, as a fused QKV
    const at::Tensor q = heads(linear(in, b.wq)), k = heads(linear(in, b.wk)),
                     v = heads(linear(in, b.wv));
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(head_dim_)));
    const at::Tensor attention = at::softmax(scores + causal_mask, -1);
    const at::Tensor y = at::matmul(attention, v).transpose(1, 2).reshape({batch, t, -1});
    return row_parallel(y, b.wo, "wo output");
  }

  at::Tensor mlp(const BlockShard& b, const at::Tensor& x) const {
    return row_parallel(at::gelu(linear(copy_to_tp(x), b.fc1)), b.fc2, "fc2 output");
  }

  int64_t head_dim_;
  int64_t vocab_size_;
  Range vocab_;
  at::Tensor tok_emb_, pos_emb_, causal_mask_;
  std::vector<BlockShard> blocks_;
  Norm ln_f_;
  at::Tensor lm_head_;
};

}  // namespace megatron
