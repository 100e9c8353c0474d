// HeadTailShard on real ranks: each rank holds chunks r and 2n-1-r of 2n, as torch.chunk cuts them (the
// oracle, not dtensor's layout code); full_tensor and every redistribution give the sequence back in
// order; ops that treat positions on their own (elementwise ops, views keeping the dim whole,
// transposes) keep it without communication; and causal attention on q, k and v placed so runs as
// context-parallel attention, load balanced by the placement alone (no set_context_parallel_load_balance),
// its output and gradients equal to attention in one process, by ring and by all-to-all, on the 4
// ranks of a 1-d mesh and on the cp dim of a (dp, cp) mesh. A mask, which context-parallel attention
// does not take, gathers the sequence in its order and still computes the right values.

#include <ATen/ATen.h>

#include <cmath>

#include "dtensor/api.h"
#include "dtensor/comm_debug.h"
#include "dtensor/sharding.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;

// Chunks `rank` and 2 ranks - 1 - rank of `t` cut into 2 ranks along `dim` by torch.chunk.
at::Tensor head_and_tail(const at::Tensor& t, int64_t dim, int64_t ranks, int64_t rank) {
  const std::vector<at::Tensor> chunks = t.chunk(2 * ranks, dim);
  return at::cat({chunks[rank], chunks[2 * ranks - 1 - rank]}, dim);
}

class HeadTailShardTest : public DistTest {};

TEST_F(HeadTailShardTest, HoldsHeadAndTailChunksAndComesBackInOrder) {
  const MeshPtr m = mesh({4});
  const int64_t rank = m->local_rank(0);
  const at::Tensor x = test_tensor({3, 16, 5}, at::kDouble, 31);
  const Placements head_tail{HeadTailShard(1)};
  const at::Tensor dx = distribute_tensor(x, m, head_tail);
  EXPECT_TRUE(tensors_equal(to_local(dx), head_and_tail(x, 1, 4, rank)));
  EXPECT_TRUE(tensors_equal(full_tensor(dx), x));
  for (const Placements& other : std::vector<Placements>{{Replicate()}, {Shard(1)}, {Shard(0)}, {Shard(2)}}) {
    SCOPED_TRACE(to_string(other));
    EXPECT_TRUE(tensors_equal(to_local(redistribute(dx, other)), expected_shard(x, m, other)));
    EXPECT_TRUE(tensors_equal(to_local(redistribute(distribute_tensor(x, m, other), head_tail)), to_local(dx)));
  }
  EXPECT_TRUE(tensors_equal(to_local(redistribute(make_dtensor_holding(x, m, {Partial()}, 3), head_tail)), to_local(dx)));
  // from_local finds the global shape from the pieces, and refuses pieces that are not two chunks of 2n.
  const at::Tensor back = from_local(head_and_tail(x, 1, 4, rank), m, head_tail);
  EXPECT_EQ(back.sizes().vec(), (Shape{3, 16, 5}));
  EXPECT_TRUE(tensors_equal(full_tensor(back), x));
  EXPECT_THAT(error_of([&] { from_local(x.narrow(1, 0, rank == 0 ? 3 : 4), m, head_tail); }),
              HasSubstr("(two equal chunks each, 2 x ranks in all)"));
  EXPECT_THAT(error_of([&] { distribute_tensor(test_tensor({3, 12, 5}, at::kDouble, 32), m, head_tail); }),
              HasSubstr("a load-balanced sequence of 12 positions does not split into 2 x 4 equal chunks"));
}

// [batch, sequence, hidden] HT(1) -> a linear layer with replicated weights, tanh, mul, add -> view
// [batch, sequence, heads, head dim] -> transpose to [batch, heads, sequence, head dim]: HT(2), nothing
// sent. A cat of two such tensors along the sequence is right too (its pieces are not one partition).
TEST_F(HeadTailShardTest, PositionWiseOpsAndViewsKeepItWithoutCommunication) {
  const MeshPtr m = mesh({4});
  const at::Tensor x = test_tensor({2, 16, 12}, at::kDouble, 33), w = test_tensor({12, 12}, at::kDouble, 34) / 8;
  const at::Tensor dx = distribute_tensor(x, m, Placements{HeadTailShard(1)}), dw = distribute_tensor(w, m, Placements{Replicate()});
  at::Tensor y;
  {
    CommDebugMode comm;
    const at::Tensor h = at::linear(dx, dw);
    y = (at::tanh(h) * 2 + h).view({2, 16, 3, 4}).transpose(1, 2);
    EXPECT_EQ(comm.total_count(), 0) << comm.summary();
  }
  EXPECT_EQ(placements_of(y), (Placements{HeadTailShard(2)}));
  const at::Tensor h = at::linear(x, w);
  EXPECT_TRUE(tensors_close(full_tensor(y), (at::tanh(h) * 2 + h).view({2, 16, 3, 4}).transpose(1, 2)));
  EXPECT_TRUE(tensors_equal(full_tensor(at::cat({dx, dx * 2}, 1)), at::cat({x, x * 2}, 1)));
}

struct Attention {
  at::Tensor out, grad_q, grad_k, grad_v;
};

// Attention and its gradients from `grad_out`: q, k, v [batch, heads, sequence, head dim] (k and v
// with fewer heads: grouped-query attention), causal; `mask` added to the scores where given.
Attention attention(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& grad_out,
                    const std::optional<at::Tensor>& mask = std::nullopt) {
  const at::Tensor q = q0.detach().requires_grad_(true), k = k0.detach().requires_grad_(true), v = v0.detach().requires_grad_(true);
  const at::Tensor out = mask ? at::scaled_dot_product_attention(q, k, v, *mask, 0.0, false, std::nullopt, /*enable_gqa=*/true)
                              : at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt, /*enable_gqa=*/true);
  out.backward(grad_out);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

at::Tensor sequence_values(int64_t heads, double frequency) {
  return at::sin(at::arange(2 * heads * 16 * 8, at::kFloat).mul(frequency)).reshape({2, heads, 16, 8});
}

// Causal attention on q, k and v HT(2) over `cp` (S(0) over "dp" where the mesh has it) runs as
// context-parallel attention by `method` and equals one process.
void expect_causal_attention_matches(const MeshPtr& m, ContextParallelAttention method) {
  Placements placed(m->ndim(), Replicate());
  placed[m->dim_index("cp")] = HeadTailShard(2);
  if (m->ndim() == 2) placed[m->dim_index("dp")] = Shard(0);
  // Grouped-query heads (2 over 4) where the method takes them: all-to-all needs heads that divide by the ranks.
  const int64_t kv_heads = method == ContextParallelAttention::AllToAll && m->size(m->dim_index("cp")) == 4 ? 4 : 2;
  const at::Tensor q = sequence_values(4, 0.31), k = sequence_values(kv_heads, 0.17), v = sequence_values(kv_heads, 0.53),
                   grad = sequence_values(4, 0.71);
  const Attention expected = attention(q, k, v, grad);
  set_context_parallel_attention(method);
  CommDebugMode comm;
  const auto place = [&](const at::Tensor& t) { return distribute_tensor(t, m, placed); };
  const Attention got = attention(place(q), place(k), place(v), place(grad));
  set_context_parallel_attention(ContextParallelAttention::Auto);
  EXPECT_EQ(placements_of(got.out), placed);
  EXPECT_EQ(placements_of(got.grad_q), placed);
  EXPECT_EQ(comm.count("all-gather"), 0) << comm.summary();
  EXPECT_TRUE(tensors_close(full_tensor(got.out), expected.out, 1e-5, 1e-6));
  EXPECT_TRUE(tensors_close(full_tensor(got.grad_q), expected.grad_q, 1e-4, 1e-5));
  EXPECT_TRUE(tensors_close(full_tensor(got.grad_k), expected.grad_k, 1e-4, 1e-5));
  EXPECT_TRUE(tensors_close(full_tensor(got.grad_v), expected.grad_v, 1e-4, 1e-5));
}

// Also under set_context_parallel_load_balance (a ContextParallel scope's order of plain shards), which
// the placement composes with: a head-tail sequence is in order.
TEST_F(HeadTailShardTest, CausalAttentionOnItRunsContextParallelAndMatchesOneProcess) {
  for (const bool scope_order : {false, true}) {
    set_context_parallel_load_balance(scope_order);
    for (const MeshPtr& m : {mesh({4}, {}, {"cp"}), mesh({2, 2}, {}, {"dp", "cp"})})
      for (const auto method : {ContextParallelAttention::Ring, ContextParallelAttention::AllToAll}) {
        SCOPED_TRACE(m->str() + (method == ContextParallelAttention::Ring ? " ring" : " all-to-all") + (scope_order ? ", scope order on" : ""));
        expect_causal_attention_matches(m, method);
      }
  }
  set_context_parallel_load_balance(false);
}

// A mask, in the sequence's order: the sequence is gathered in that order, and the values are right.
TEST_F(HeadTailShardTest, AttentionWithAMaskGathersTheSequenceInOrder) {
  const MeshPtr m = mesh({4});
  const at::Tensor q = sequence_values(4, 0.31), k = sequence_values(4, 0.17), v = sequence_values(4, 0.53), grad = sequence_values(4, 0.71);
  const at::Tensor mask = at::sin(at::arange(16 * 16, at::kFloat)).reshape({16, 16});
  const Attention expected = attention(q, k, v, grad, mask);
  const auto place = [&](const at::Tensor& t) { return distribute_tensor(t, m, Placements{HeadTailShard(2)}); };
  const Attention got = attention(place(q), place(k), place(v), place(grad), distribute_tensor(mask, m, Placements{Replicate()}));
  EXPECT_TRUE(tensors_close(full_tensor(got.out), expected.out, 1e-5, 1e-6));
  EXPECT_TRUE(tensors_close(full_tensor(got.grad_q), expected.grad_q, 1e-4, 1e-5));
  EXPECT_TRUE(tensors_close(full_tensor(got.grad_v), expected.grad_v, 1e-4, 1e-5));
}

}  // namespace
}  // namespace dtensor::testing
