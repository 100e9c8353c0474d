// Context parallelism of a model written on plain tensors (dtensor/context_parallel.h): a one-layer
// causal language model with grouped-query attention whose attention module the plan gives
// context_parallel_attention_style(), trained one step on 4 ranks with its tokens, position ids and
// targets sharded by a ContextParallel scope (load balanced on 16 positions, and in plain blocks on
// 12 and on 13, whose blocks are uneven), against the whole model in one process: the loss (summed over the ranks) and every parameter's
// gradient (summed too). The same with rotary position embeddings instead of learned ones, whose cos and
// sin tables are module buffers the scope shards with the tokens (as torchtitan shards freqs_cis). Also:
// shard and unshard round trips, and what is refused.

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "dtensor/api.h"
#include "dtensor/comm_debug.h"
#include "dtensor/context_parallel.h"
#include "dtensor/layout.h"
#include "dtensor/module.h"
#include "dtensor/parallel.h"
#include "dtensor/sharding.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

constexpr int64_t kVocab = 16, kDim = 24, kModelHeads = 4, kKvHeads = 2, kModelHeadDim = 6, kMaxLength = 16;

class CausalAttentionImpl : public torch::nn::Module {
 public:
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt, /*enable_gqa=*/true);
  }
};
TORCH_MODULE(CausalAttention);

// Rotary position embedding: each head's first and second halves rotated by the angles of the positions
// the tables hold (rows of [positions, head dim / 2]).
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor first = x.narrow(-1, 0, kModelHeadDim / 2), second = x.narrow(-1, kModelHeadDim / 2, kModelHeadDim / 2);
  return at::cat({first * cos - second * sin, first * sin + second * cos}, -1);
}

// The cos and sin tables of positions 0..length-1.
std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t length) {
  const at::Tensor frequencies = at::pow(100.0, at::arange(kModelHeadDim / 2, at::kDouble) / -(kModelHeadDim / 2.0));
  const at::Tensor angles = at::outer(at::arange(length, at::kDouble), frequencies);
  return {angles.cos(), angles.sin()};
}

class TinyLmImpl : public torch::nn::Module {
 public:
  // With `rotary_length`, positions enter as rotary embeddings of q and k from cos and sin buffers of
  // that many positions, which the model reads whole (as many rows as the tokens it is given).
  explicit TinyLmImpl(std::optional<int64_t> rotary_length = std::nullopt)
      : tok(register_module("tok", torch::nn::Embedding(kVocab, kDim))),
        pos(register_parameter("pos", at::randn({kMaxLength, kDim}))),
        wq(register_module("wq", torch::nn::Linear(kDim, kModelHeads * kModelHeadDim))),
        wk(register_module("wk", torch::nn::Linear(kDim, kKvHeads * kModelHeadDim))),
        wv(register_module("wv", torch::nn::Linear(kDim, kKvHeads * kModelHeadDim))),
        wo(register_module("wo", torch::nn::Linear(kModelHeads * kModelHeadDim, kDim))),
        head(register_module("head", torch::nn::Linear(kDim, kVocab))),
        attention(register_module("attention", CausalAttention())) {
    if (!rotary_length) return;
    const auto [cos_table, sin_table] = rotary_tables(*rotary_length);
    cos = register_buffer("cos", cos_table);
    sin = register_buffer("sin", sin_table);
  }

  // The summed next-token cross-entropy of the positions given, over `total` (the whole batch's count).
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& targets, double total) {
    const int64_t b = tokens.size(0), t = tokens.size(1);
    const bool rotary = cos.defined();
    const at::Tensor x = rotary ? tok(tokens) : tok(tokens) + pos.index_select(0, positions);
    auto heads = [&](const at::Tensor& y) { return y.view({b, t, -1, kModelHeadDim}).transpose(1, 2); };
    auto positioned = [&](const at::Tensor& y) { return rotary ? rotate(heads(y), cos, sin) : heads(y); };
    const at::Tensor y = dtensor::call(attention, positioned(wq(x)), positioned(wk(x)), heads(wv(x))).transpose(1, 2).reshape({b, t, -1});
    const at::Tensor logits = head(x + wo(y));
    namespace F = torch::nn::functional;
    return F::cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1), F::CrossEntropyFuncOptions().reduction(torch::kSum)) / total;
  }

  torch::nn::Embedding tok;
  at::Tensor pos, cos, sin;
  torch::nn::Linear wq, wk, wv, wo, head;
  CausalAttention attention;
};
TORCH_MODULE(TinyLm);

struct Step {
  double loss;
  std::vector<at::Tensor> grads;
};

TinyLm seeded_model(std::optional<int64_t> rotary_length) {
  torch::manual_seed(7);
  TinyLm model(rotary_length);
  model->to(at::kDouble);
  return model;
}

class ContextParallelTest : public DistTest {
 protected:
  // One step of the model on 3 rows of `length` tokens, in one process or (cp given) context parallel.
  static Step step(int64_t length, const MeshPtr& cp, ContextParallelOptions options, bool rotary) {
    TinyLm model = seeded_model(rotary ? std::optional<int64_t>(length) : std::nullopt);
    if (cp) parallelize_module(*model, cp, {{"attention", context_parallel_attention_style()}});
    const at::Tensor sequence = at::arange(3 * (length + 1), at::kLong).remainder(kVocab).view({3, length + 1});
    at::Tensor tokens = sequence.slice(1, 0, length).contiguous(), targets = sequence.slice(1, 1).contiguous();
    at::Tensor positions = at::arange(length, at::kLong);
    at::Tensor loss;
    {
      std::optional<ContextParallel> sharded;
      if (cp && rotary) sharded.emplace(cp, std::vector<at::Tensor>{tokens, model->cos, model->sin, targets}, std::vector<int64_t>{1, 0, 0, 1}, options);
      else if (cp) sharded.emplace(cp, std::vector<at::Tensor>{tokens, positions, targets}, std::vector<int64_t>{1, 0, 1}, options);
      loss = model->forward(tokens, positions, targets, 3.0 * static_cast<double>(length));
      loss.backward();
      if (cp) EXPECT_EQ(tokens.size(1), options.load_balance ? length / cp->size() : chunk_extent(length, cp->size(), cp->local_rank(0)).size);
    }
    EXPECT_EQ(tokens.size(1), length);  // the whole sequence back
    Step out{loss.item<double>(), {}};
    for (const at::Tensor& p : model->parameters())
      if (p.grad().defined()) out.grads.push_back(p.grad());  // the learned positions have none under rotary
    if (!cp) return out;
    // Each rank's positions contribute their share: the whole is the sum over the ranks.
    const auto summed = [&](const at::Tensor& t) { return full_tensor(from_local(t, cp, {Partial()}, {.run_check = false})); };
    out.loss = summed(at::tensor({out.loss}, at::kDouble)).item<double>();
    for (at::Tensor& g : out.grads) g = summed(g);
    return out;
  }

  void expect_matches_one_process(int64_t length, ContextParallelOptions options, bool rotary = false) {
    const MeshPtr cp = mesh({4}, {}, {"cp"});
    const Step expected = step(length, nullptr, options, rotary);
    CommDebugMode comm;
    const Step got = step(length, cp, options, rotary);
    EXPECT_EQ(comm.count("all-gather"), 0) << comm.summary();  // attention gathers no sequence
    EXPECT_NEAR(got.loss, expected.loss, 1e-10);
    ASSERT_EQ(got.grads.size(), expected.grads.size());
    for (size_t i = 0; i < got.grads.size(); ++i) EXPECT_TRUE(at::allclose(got.grads[i], expected.grads[i], 1e-9, 1e-11)) << "parameter " << i;
    EXPECT_FALSE(context_parallel_load_balance());  // the scope's setting is gone with it
  }
};

TEST_F(ContextParallelTest, LoadBalancedCausalModelMatchesOneProcess) { expect_matches_one_process(16, {.load_balance = true}); }

TEST_F(ContextParallelTest, PlainBlocksMatchOneProcess) {
  expect_matches_one_process(12, {.load_balance = false});
  expect_matches_one_process(13, {.load_balance = false});  // blocks of 4, 4, 4 and 1: the scope gives the style the length
}

TEST_F(ContextParallelTest, RotaryTablesShardedWithTheTokensMatchOneProcess) {
  expect_matches_one_process(16, {.load_balance = true}, /*rotary=*/true);
  expect_matches_one_process(12, {.load_balance = false}, /*rotary=*/true);
}

TEST_F(ContextParallelTest, ShardAndUnshardRoundTrip) {
  const MeshPtr cp = mesh({4}, {}, {"cp"});
  const at::Tensor whole = at::arange(2 * 16 * 3, at::kDouble).view({2, 16, 3});
  const at::Tensor balanced = context_parallel_shard(whole, *cp, 1);
  const int64_t r = cp->local_rank(0);
  EXPECT_TRUE(at::equal(balanced, at::cat({whole.narrow(1, 2 * r, 2), whole.narrow(1, 2 * (7 - r), 2)}, 1)));
  EXPECT_TRUE(at::equal(context_parallel_unshard(balanced, cp, 1), whole));
  const at::Tensor uneven = whole.narrow(1, 0, 13);  // 4 + 4 + 4 + 1
  const at::Tensor block = context_parallel_shard(uneven, *cp, 1, {.load_balance = false});
  EXPECT_EQ(block.size(1), r < 3 ? 4 : 1);
  EXPECT_TRUE(at::equal(context_parallel_unshard(block, cp, 1, {.load_balance = false}), uneven));
}

TEST_F(ContextParallelTest, RefusesWhatItCannotShard) {
  const MeshPtr cp = mesh({4}, {}, {"cp"});
  at::Tensor tokens = at::zeros({2, 16}, at::kLong), positions = at::arange(12, at::kLong);
  EXPECT_THAT(error_of([&] { ContextParallel scope(cp, {tokens, positions}, {1, 0}); }),
              ::testing::HasSubstr("buffer 1 has 12 positions along dim 0, but buffer 0 has 16: every buffer (tokens, position ids, labels) "
                                   "must be sharded like the others over mesh dim 0 (cp)"));
  EXPECT_EQ(positions.size(0), 12);  // nothing was sharded
  EXPECT_THAT(error_of([&] { context_parallel_shard(at::zeros({2, 12}), *cp, 1); }),
              ::testing::HasSubstr("a load-balanced sequence of 12 positions does not split into 2 x 4 equal chunks"));
  // A mask on a load-balanced sequence: its order is not the mask's.
  ContextParallel scope(cp, {tokens}, {1});
  const at::Tensor q = from_local(at::ones({1, 4, 4, 6}, at::kDouble), cp, {Shard(2)}, {.run_check = false});
  const at::Tensor mask = distribute_tensor(at::zeros({16, 16}, at::kDouble), cp, Placements{Replicate()});
  EXPECT_THAT(error_of([&] { at::scaled_dot_product_attention(q, q, q, mask); }),
              ::testing::AllOf(::testing::HasSubstr("_scaled_dot_product_flash_attention_for_cpu"),
                               ::testing::HasSubstr("load-balanced sequence sharded over mesh dim 0 (cp) runs only as context-parallel attention")));
}

}  // namespace
}  // namespace dtensor::testing
