// Context-parallel attention (src/sharding/kernels/context_attention.h), by ring and by all-to-all, on
// sequence blocks, against attention computed
// in one process on the whole tensors by plain math (scores, mask, softmax; autograd for the
// gradients): each rank's block of the output and logsumexp, and of the gradients of q, k and v from a
// given output gradient. On the 4 ranks of a 1-d mesh and on the 2-rank cp dim of a 2x2 mesh, for a
// sequence that does not divide (13 positions: 7 + 6 on 2 ranks, 4 + 4 + 4 + 1 on 4), causal and
// full, with as many kv heads as query heads and with grouped-query attention (4 over 2); and the same
// through DTensor's scaled_dot_product_attention on sequence-sharded inputs, by the method the cost
// picks and by each forced one; all-to-all refuses heads that do not divide.

#include <ATen/ATen.h>

#include <cmath>

#include "../../src/sharding/eager_graph_form.h"
#include "../../src/sharding/kernels/context_attention.h"
#include "dtensor/api.h"
#include "dtensor/comm_debug.h"
#include "dtensor/layout.h"
#include "dtensor/sharding.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

constexpr int64_t kBatch = 2, kHeads = 4, kLength = 13, kHeadDim = 5;

at::Tensor values(int64_t heads, double frequency, int64_t length = kLength) {
  return at::sin(at::arange(kBatch * heads * length * kHeadDim, at::kDouble).mul(frequency)).reshape({kBatch, heads, length, kHeadDim});
}

// This rank's positions along dim 2 (of `ranks`): its torch.chunk piece, or, load balanced, chunks
// `rank` and 2 ranks - 1 - rank of 2 ranks equal ones.
at::Tensor block_of(const at::Tensor& t, int64_t ranks, int64_t rank, bool load_balanced) {
  if (!load_balanced) {
    const ChunkExtent mine = chunk_extent(t.size(2), ranks, rank);
    return t.narrow(2, mine.offset, mine.size).contiguous();
  }
  const int64_t chunk = t.size(2) / (2 * ranks);
  return at::cat({t.narrow(2, rank * chunk, chunk), t.narrow(2, (2 * ranks - 1 - rank) * chunk, chunk)}, 2);
}

struct Whole {
  at::Tensor out, lse, grad_q, grad_k, grad_v;
};

// One process: softmax(q k^T * scale + mask) v, each kv head serving its group of query heads.
Whole one_process(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& grad_out, bool causal, double scale) {
  const at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
  const int64_t group = q.size(1) / k.size(1), length = q.size(2);
  at::Tensor scores = at::matmul(q, k.repeat_interleave(group, 1).transpose(-2, -1)) * scale;
  if (causal) scores = scores.masked_fill(at::ones({length, length}, at::kBool).triu(1), -INFINITY);
  const at::Tensor lse = scores.logsumexp(-1);
  const at::Tensor out = at::matmul(at::softmax(scores, -1), v.repeat_interleave(group, 1));
  out.backward(grad_out);
  return {out.detach(), lse.detach(), q.grad(), k.grad(), v.grad()};
}

class ContextAttentionTest : public DistTest {
 protected:
  // Load balanced on 16 positions (2 x 4 ranks x 2), else on 13.
  void expect_matches_one_process(const MeshPtr& m, int64_t dim, bool load_balanced = false) {
    const int64_t length = load_balanced ? 16 : kLength;
    const auto block = [&](const at::Tensor& t) { return block_of(t, m->size(dim), m->local_rank(dim), load_balanced); };
    const double scale = 0.37;
    for (const bool causal : {true, false}) {
      // Query and kv heads: with 8 and 4, each rank of 2 holds 4 and 2, whose all-to-all backward runs in
      // halves of grouped-query heads; with 4 and 2 on 2 ranks (8 and 4 on 4), the halves share a kv head.
      for (const auto& [query_heads, kv_heads] : {std::pair<int64_t, int64_t>{kHeads, kHeads}, {kHeads, 2}, {8, 4}}) {
        SCOPED_TRACE(std::string(causal ? "causal" : "full") + ", " + std::to_string(query_heads) + " query and " + std::to_string(kv_heads) +
                     " kv heads over mesh dim " + std::to_string(dim));
        const at::Tensor q = values(query_heads, 0.31, length), k = values(kv_heads, 0.17, length), v = values(kv_heads, 0.53, length),
                         grad_out = values(query_heads, 0.71, length);
        const Whole expected = one_process(q, k, v, grad_out, causal, scale);
        const detail::ContextAttention call{m, dim, length, causal, scale, load_balanced};
        using Forward = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, const detail::ContextAttention&);
        using Backward = std::tuple<at::Tensor, at::Tensor, at::Tensor> (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                                            const at::Tensor&, const at::Tensor&, const detail::ContextAttention&);
        const std::vector<std::tuple<const char*, Forward, Backward>> methods = {
            {"ring", detail::ring_attention_forward, detail::ring_attention_backward},
            {"all-to-all", detail::all_to_all_attention_forward, detail::all_to_all_attention_backward}};
        for (const auto& [method, run_forward, run_backward] : methods) {
          SCOPED_TRACE(method);
          if (std::string(method) == "all-to-all" && kv_heads % m->size(dim) != 0) continue;  // refused (below)
          const auto [out, lse] = run_forward(block(q), block(k), block(v), call);
          EXPECT_TRUE(at::allclose(out, block(expected.out), 1e-10, 1e-12));
          EXPECT_TRUE(at::allclose(lse, block(expected.lse.unsqueeze(-1)).squeeze(-1), 1e-10, 1e-12));
          const auto [grad_q, grad_k, grad_v] = run_backward(block(grad_out), block(q), block(k), block(v), out, lse, call);
          EXPECT_TRUE(at::allclose(grad_q, block(expected.grad_q), 1e-10, 1e-12));
          EXPECT_TRUE(at::allclose(grad_k, block(expected.grad_k), 1e-10, 1e-12));
          EXPECT_TRUE(at::allclose(grad_v, block(expected.grad_v), 1e-10, 1e-12));
        }
      }
    }
  }
};

TEST_F(ContextAttentionTest, FourRanksMatchOneProcess) { expect_matches_one_process(mesh({4}, {}, {"cp"}), 0); }

TEST_F(ContextAttentionTest, TheCpDimOfA2x2MeshMatchesOneProcess) { expect_matches_one_process(mesh({2, 2}, {}, {"dp", "cp"}), 1); }

TEST_F(ContextAttentionTest, LoadBalancedBlocksMatchOneProcess) {
  expect_matches_one_process(mesh({4}, {}, {"cp"}), 0, /*load_balanced=*/true);
  expect_matches_one_process(mesh({2, 2}, {}, {"dp", "cp"}), 1, /*load_balanced=*/true);
}

// Through DTensor: q, k and v distributed Shard(2) over the cp dim, scaled_dot_product_attention (the
// CPU flash kernels, forward and backward) runs as the ring, gathering nothing, and its output and
// gradients are one process's.
TEST_F(ContextAttentionTest, AttentionOnSequenceShardsStaysSharded) {
  const MeshPtr m = mesh({4}, {}, {"cp"});
  const Placements sequence{Shard(2)};
  for (const auto method : {ContextParallelAttention::Auto, ContextParallelAttention::Ring, ContextParallelAttention::AllToAll}) {
    set_context_parallel_attention(method);
    for (const bool causal : {true, false}) {
      for (const int64_t kv_heads : {kHeads, int64_t{2}}) {
        if (method == ContextParallelAttention::AllToAll && kv_heads % 4 != 0) continue;  // refused, below
        SCOPED_TRACE(std::string(causal ? "causal" : "full") + ", " + std::to_string(kv_heads) + " kv heads, method " +
                     std::to_string(static_cast<int>(method)));
        const at::Tensor q = values(kHeads, 0.31), k = values(kv_heads, 0.17), v = values(kv_heads, 0.53), grad_out = values(kHeads, 0.71);
        const Whole expected = one_process(q, k, v, grad_out, causal, 0.37);
        const at::Tensor dq = distribute_tensor(q, m, sequence).requires_grad_(true), dk = distribute_tensor(k, m, sequence).requires_grad_(true),
                         dv = distribute_tensor(v, m, sequence).requires_grad_(true);
        CommDebugMode comm;
        const at::Tensor out = at::scaled_dot_product_attention(dq, dk, dv, {}, 0.0, causal, 0.37, /*enable_gqa=*/kv_heads != kHeads);
        out.backward(distribute_tensor(grad_out, m, sequence));
        EXPECT_EQ(comm.count("all-gather"), 0) << comm.summary();
        // On these small tensors the ring's fewer messages cost less than the all-to-alls.
        EXPECT_EQ(comm.count("all-to-all") > 0, method == ContextParallelAttention::AllToAll) << comm.summary();
        EXPECT_EQ(placements_of(out), sequence);
        EXPECT_TRUE(at::allclose(full_tensor(out), expected.out, 1e-10, 1e-12));
        EXPECT_TRUE(at::allclose(full_tensor(dq.grad()), expected.grad_q, 1e-10, 1e-12));
        EXPECT_TRUE(at::allclose(full_tensor(dk.grad()), expected.grad_k, 1e-10, 1e-12));
        EXPECT_TRUE(at::allclose(full_tensor(dv.grad()), expected.grad_v, 1e-10, 1e-12));
      }
    }
  }
  // All-to-all forced with 2 kv heads over 4 ranks.
  const at::Tensor q = distribute_tensor(values(kHeads, 0.31), m, sequence), kv = distribute_tensor(values(2, 0.17), m, sequence);
  EXPECT_THAT(error_of([&] { at::scaled_dot_product_attention(q, kv, kv, {}, 0.0, true, std::nullopt, true); }),
              ::testing::AllOf(::testing::HasSubstr("_scaled_dot_product_flash_attention_for_cpu"),
                               ::testing::HasSubstr("mesh dim 0 (cp) (4 ranks) needs heads that divide by the ranks")));
  set_context_parallel_attention(ContextParallelAttention::Auto);
}

// The graph form of context-parallel attention (what a saved per-rank program computes: keys and values
// all-gathered, the rank's queries attended to the blocks before theirs and to their own, merged; the key
// and value gradients reduce-scattered), run eagerly in place of the kernels: one process's output and
// gradients, on 13 positions over the 4 ranks of a 1-d mesh and over the cp dim of a 2x2 mesh, causal
// and full, with grouped-query attention, by either method's form.
TEST_F(ContextAttentionTest, TheGraphFormMatchesOneProcess) {
  detail::set_graph_forms_run_eagerly(true);
  for (const auto& [m, dim] : {std::pair{mesh({4}, {}, {"cp"}), int64_t{0}}, std::pair{mesh({2, 2}, {}, {"dp", "cp"}), int64_t{1}}}) {
    Placements sequence(static_cast<size_t>(m->ndim()), Replicate());
    sequence[static_cast<size_t>(dim)] = Shard(2);
    for (const auto method : {ContextParallelAttention::Ring, ContextParallelAttention::AllToAll}) {
      set_context_parallel_attention(method);
      for (const bool causal : {true, false}) {
        for (const int64_t kv_heads : {kHeads, int64_t{2}}) {
          if (method == ContextParallelAttention::AllToAll && kv_heads % m->size(dim) != 0) continue;
          SCOPED_TRACE(std::string(causal ? "causal" : "full") + ", " + std::to_string(kv_heads) + " kv heads on " + m->str());
          const at::Tensor q = values(kHeads, 0.31), k = values(kv_heads, 0.17), v = values(kv_heads, 0.53), grad_out = values(kHeads, 0.71);
          const Whole expected = one_process(q, k, v, grad_out, causal, 0.37);
          const at::Tensor dq = distribute_tensor(q, m, sequence).requires_grad_(true), dk = distribute_tensor(k, m, sequence).requires_grad_(true),
                           dv = distribute_tensor(v, m, sequence).requires_grad_(true);
          const uint64_t forms_before = detail::calls_with_a_graph_form();
          const at::Tensor out = at::scaled_dot_product_attention(dq, dk, dv, {}, 0.0, causal, 0.37, /*enable_gqa=*/kv_heads != kHeads);
          out.backward(distribute_tensor(grad_out, m, sequence));
          EXPECT_EQ(detail::calls_with_a_graph_form() - forms_before, 2u);  // the forward's and the backward's
          EXPECT_TRUE(at::allclose(full_tensor(out), expected.out, 1e-10, 1e-12));
          EXPECT_TRUE(at::allclose(full_tensor(dq.grad()), expected.grad_q, 1e-10, 1e-12));
          EXPECT_TRUE(at::allclose(full_tensor(dk.grad()), expected.grad_k, 1e-10, 1e-12));
          EXPECT_TRUE(at::allclose(full_tensor(dv.grad()), expected.grad_v, 1e-10, 1e-12));
        }
      }
    }
  }
  set_context_parallel_attention(ContextParallelAttention::Auto);
  detail::set_graph_forms_run_eagerly(false);
}

// Auto: on longer sequences the all-to-alls (each rank sends 3/16 of every tensor once) move fewer
// bytes than the ring (3/4 of the keys and values), and are chosen.
TEST_F(ContextAttentionTest, AutoTakesAllToAllWhereItMovesLess) {
  const MeshPtr m = mesh({4}, {}, {"cp"});
  const at::Tensor x = at::sin(at::arange(4 * 256 * 8, at::kDouble).mul(0.13)).reshape({1, 4, 256, 8});  // alike on every rank
  const at::Tensor q = distribute_tensor(x, m, Placements{Shard(2)});
  CommDebugMode comm;
  const at::Tensor out = at::scaled_dot_product_attention(q, q, q, {}, 0.0, true);
  EXPECT_GT(comm.count("all-to-all"), 0) << comm.summary();
  EXPECT_TRUE(at::allclose(full_tensor(out), at::scaled_dot_product_attention(x, x, x, {}, 0.0, true), 1e-10, 1e-12));
}

TEST_F(ContextAttentionTest, RefusesBlocksThatDoNotFit) {
  const MeshPtr m = mesh({4}, {}, {"cp"});
  const detail::ContextAttention call{m, 0, kLength, true, std::nullopt};
  const at::Tensor q = at::zeros({1, 4, 2, 3}, at::kDouble);
  EXPECT_THAT(error_of([&] { detail::ring_attention_forward(q, q, q, call); }), ::testing::HasSubstr("shard all three alike along the sequence"));
  const detail::ContextAttention balanced{m, 0, 12, true, std::nullopt, /*load_balanced=*/true};
  const at::Tensor block = at::zeros({1, 4, 3, 3}, at::kDouble);
  EXPECT_THAT(error_of([&] { detail::ring_attention_forward(block, block, block, balanced); }),
              ::testing::HasSubstr("mesh dim 0 (cp): a load-balanced sequence of 12 positions does not split into 2 x 4 equal chunks"));
}

}  // namespace
}  // namespace dtensor::testing
