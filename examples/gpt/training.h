#pragma once
// What the GPT main job, its test and its benchmark share: the corpus, batches, the tensor-parallel
// plans and one optimizer step.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/adamw.h>

#include <fstream>
#include <sstream>
#include <string>

#include "dtensor/context_parallel.h"
#include "dtensor/dtensor.h"
#include "dtensor/fsdp.h"
#include "dtensor/optim.h"
#include "dtensor/parallel.h"
#include "gpt_model.h"

namespace gpt {

// A character-level corpus: the sorted distinct characters are the vocabulary.
struct Corpus {
  std::string vocabulary;
  at::Tensor tokens;  // int64 [length]
};

inline Corpus load_corpus(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the corpus " + path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  Corpus corpus;
  bool seen[256] = {};
  for (unsigned char ch : s) seen[ch] = true;
  int64_t index[256];
  for (int ch = 0; ch < 256; ++ch)
    if (seen[ch]) {
      index[ch] = static_cast<int64_t>(corpus.vocabulary.size());
      corpus.vocabulary.push_back(static_cast<char>(ch));
    }
  std::vector<int64_t> ids;
  for (unsigned char ch : s) ids.push_back(index[ch]);
  corpus.tokens = at::tensor(ids, at::kLong);
  return corpus;
}

// The main job's model (and the benchmark's): sized for a few seconds of training per mode on CPU.
inline Config demo_config(const Corpus& corpus) {
  Config c;
  c.vocab = static_cast<int64_t>(corpus.vocabulary.size());
  c.seq_len = 32;
  c.dim = 128;
  c.heads = 8;
  c.layers = 2;
  c.ffn = 512;
  return c;
}

// The main job's context-parallel model: the demo model on sequences twice as long (64 positions), its
// attention fused and its positions read from a buffer, as context parallelism needs.
inline Config long_context_config(const Corpus& corpus) {
  Config c = demo_config(corpus);
  c.seq_len = 64;
  c.fused_attention = true;
  return c;
}

// A model's mixture-of-experts variant: 4 SwiGLU experts of 128 features in place of each block's MLP,
// each token routed to its top 2 (Mixtral's routing).
inline Config with_experts(Config c) {
  c.moe_experts = 4;
  c.moe_top_k = 2;
  c.moe_intermediate = 128;
  return c;
}

struct Batch {
  at::Tensor tokens, targets;  // [batch, seq]
};

// The same batches on every rank and in the single-process run (a generator of its own, seeded).
class Batches {
 public:
  Batches(const Corpus& corpus, int64_t batch, int64_t seq_len, uint64_t seed)
      : corpus_(corpus), batch_(batch), seq_len_(seq_len), generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  Batch next() {
    const int64_t last_start = corpus_.tokens.size(0) - seq_len_ - 1;
    const at::Tensor starts = at::randint(last_start + 1, {batch_}, generator_, at::kLong);
    std::vector<at::Tensor> x, y;
    for (int64_t i = 0; i < batch_; ++i) {
      const int64_t s = starts[i].item<int64_t>();
      x.push_back(corpus_.tokens.slice(0, s, s + seq_len_));
      y.push_back(corpus_.tokens.slice(0, s + 1, s + seq_len_ + 1));
    }
    return {at::stack(x), at::stack(y)};
  }

 private:
  const Corpus& corpus_;
  int64_t batch_, seq_len_;
  at::Generator generator_;
};

// Megatron-style tensor parallelism of the GPT: vocabulary-parallel token embedding, column-parallel
// q/k/v and fc1, row-parallel wo and fc2, a column-parallel LM head whose class-sharded logits go
// straight into the cross-entropy (loss parallel). With local_activations, everything between the
// parallel layers (attention on this rank's heads, norms, residuals) runs on plain local tensors, as
// Megatron does; without, activations stay DTensors throughout.
inline dtensor::ParallelizePlan tensor_parallel_plan(bool local_activations) {
  using namespace dtensor;
  const bool local = local_activations;
  return {
      {"", PrepareModuleInput{{Replicate(), Replicate()}, {Replicate(), Replicate()}}},
      {"tok_emb", RowwiseParallel{.input_layout = Replicate(), .output_layout = Replicate(), .use_local_output = local}},
      // One DTensor input for q, k and v: their input gradients meet in one all-reduce, as Megatron's
      // fused QKV projection does.
      {"blocks.*.attn", PrepareModuleInput{{Replicate(), std::nullopt}, {Replicate(), std::nullopt}}},
      {"blocks.*.attn.w[qkv]", ColwiseParallel{.use_local_output = local}},
      {"blocks.*.attn.wo", RowwiseParallel{.use_local_output = local}},
      {"blocks.*.mlp.fc1", ColwiseParallel{.use_local_output = local}},
      {"blocks.*.mlp.fc2", RowwiseParallel{.use_local_output = local}},
      {"lm_head", ColwiseParallel{.use_local_output = false}},
  };
}

// Tensor parallel over `mesh` (1-d), or data parallel x tensor parallel over a 2-d mesh named
// ("dp", "tp"): there activations stay DTensors and every other parameter becomes a DTensor too,
// Replicate everywhere, so that its gradient is reduced over dp.
inline void parallelize(Gpt& model, const dtensor::MeshPtr& mesh) {
  if (mesh->ndim() == 1) {
    dtensor::parallelize_module(*model, mesh, tensor_parallel_plan(/*local_activations=*/true));
  } else {
    dtensor::parallelize_module(*model, mesh, tensor_parallel_plan(/*local_activations=*/false), {.tp_dim = "tp"});
    dtensor::distribute_module(*model, mesh);
  }
}

// Context parallelism over the 1-d mesh `cp`: every block's attention kernel takes its q, k and v as
// sequence shards over cp (ring or all-to-all attention); the rest of the model runs on each rank's
// positions. The model needs fused attention (Config::fused_attention).
inline void context_parallelize(Gpt& model, const dtensor::MeshPtr& cp) {
  dtensor::parallelize_module(*model, cp, {{"blocks.*.attn.kernel", dtensor::context_parallel_attention_style()}});
}

// Fully sharded data parallel over the 1-d mesh `dp`, wrapped as FSDP2 users do: each block is a
// group (gathered before its forward, freed after), then the root takes the rest (embeddings, final
// norm, head).
inline void fully_shard(Gpt& model, const dtensor::MeshPtr& dp, const dtensor::FullyShardOptions& options = {}) {
  for (const auto& block : *model->blocks) dtensor::fully_shard(*block, dp, options);
  dtensor::fully_shard(*model, dp, options);
}

// Expert parallelism inside fully sharded data parallelism, as torchtitan composes them, on a mesh
// ("dp", "ep") whose every rank trains on its own rows (or positions, under context parallelism): each block's experts are spread over ep (the
// tokens travel to them by all-to-all) and fully sharded over dp (torchtitan's efsdp); the dense
// parameters are fully sharded over all ranks (the mesh flattened). An expert's gradient sums the
// tokens of its ep group, and FSDP sums those over dp: divided by the world, it is the mean the dense
// gradients are. Returns the flattened mesh (every data-parallel rank).
inline dtensor::MeshPtr expert_parallelize(Gpt& model, const dtensor::MeshPtr& mesh) {
  const dtensor::MeshPtr everyone = mesh->flatten("data");
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    dtensor::MoEImpl& moe = *model->blocks[i]->as<BlockImpl>()->moe;
    dtensor::expert_parallel(moe, (*mesh)["ep"], 0, "blocks." + std::to_string(i) + ".moe");
    dtensor::fully_shard(*moe.experts, mesh, {.dp_dim = "dp"});
    dtensor::set_gradient_divide_factor(*moe.experts, static_cast<double>(everyone->size()));
  }
  fully_shard(model, everyone);
  return everyone;
}

// The mean over the data-parallel mesh `dp` (every dim of it data parallel) of every rank's loss on its
// own rows: the whole batch's mean loss when the ranks hold equally many rows.
inline double mean_over(const dtensor::MeshPtr& dp, double local_loss) {
  const at::Tensor local = at::tensor({local_loss}, at::kDouble);
  const dtensor::Placements averaged(static_cast<size_t>(dp->ndim()), dtensor::Partial(dtensor::ReduceOp::Avg));
  return dtensor::full_tensor(dtensor::from_local(local, dp, averaged)).item<double>();
}

// The loss as a number, from a DTensor (possibly Partial: the loss-parallel cross-entropy may leave its
// sum unreduced until read) or a plain tensor.
inline double value_of(const at::Tensor& loss) {
  at::NoGradGuard no_grad;
  return (dtensor::is_dtensor(loss) ? dtensor::full_tensor(loss) : loss).item<double>();
}

struct TrainOptions {
  double lr = 3e-3;
  double weight_decay = 0.01;
  double max_grad_norm = 1.0;
};

// One step: forward, backward, clip by the global gradient norm, AdamW (on the parameters' local
// shards: the same update as optimizer.step(), without a DTensor op per element-wise operation, in
// ATen's fused kernel).
// Returns the loss.
inline double train_step(Gpt& model, torch::optim::Optimizer& optimizer, const Batch& batch,
                         const TrainOptions& options) {
  optimizer.zero_grad();
  at::Tensor loss = dtensor::call(model, batch.tokens, batch.targets);
  loss.backward();
  dtensor::clip_grad_norm_(model->parameters(), options.max_grad_norm);
  dtensor::step_on_local_shards(optimizer, {.fused = true});
  return value_of(loss);
}

inline torch::optim::AdamW make_optimizer(Gpt& model, const TrainOptions& options) {
  return torch::optim::AdamW(model->parameters(),
                             torch::optim::AdamWOptions(options.lr).weight_decay(options.weight_decay));
}

}  // namespace gpt
