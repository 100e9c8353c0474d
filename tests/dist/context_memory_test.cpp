// The memory context parallelism saves: the peak live bytes of causal attention forward and backward on
// a sequence of 8192 positions (8 query heads, 4 key/value heads, head dim 32, float), inputs and
// gradients included, per rank of a CP=4 mesh by ring and by all-to-all, against one process holding
// the whole sequence (run on rank 0). Measured on MPI (deterministic allocation counts): ring 0.316x,
// all-to-all 0.316x; the bound is 0.35x. Both are held to 0.33x so that a regression fails:
// - the all-to-all's backward in one pass (blocks and head groups of every head, each kernel's own
//   gradients) measured 0.369x; it now runs in two halves of the heads adding into one set of gradients;
// - a DTensor's first new_empty_strided (AccumulateGrad's) used to allocate the whole global tensor
//   while propagating its shape, which set both methods' peak at 0.349x (propagation_memory_test.cpp).
// On Gloo the counter reads more, by a different amount on every run: Gloo's worker thread may drop the
// last reference to a sent buffer, and this thread's counter never sees that free.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "dtensor/api.h"
#include "dtensor/sharding.h"
#include "harness.h"
#include "peak_live_bytes.h"

namespace dtensor::testing {
namespace {

constexpr int64_t kMemoryQueryHeads = 8, kPositions = 8192, kMemoryHeadDim = 32;

// Attention forward and backward on blocks of `positions` made inside the count; `shard` turns each
// into what attention runs on (a DTensor, or the tensor itself).
template <typename Shard>
int64_t peak_of_attention(int64_t positions, int64_t kv_heads, Shard shard) {
  PeakLiveBytes bytes;
  const at::Tensor q = shard(at::randn({1, kMemoryQueryHeads, positions, kMemoryHeadDim})).requires_grad_(true);
  const at::Tensor k = shard(at::randn({1, kv_heads, positions, kMemoryHeadDim})).requires_grad_(true);
  const at::Tensor v = shard(at::randn({1, kv_heads, positions, kMemoryHeadDim})).requires_grad_(true);
  const at::Tensor out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt, /*enable_gqa=*/true);
  out.backward(shard(at::randn({1, kMemoryQueryHeads, positions, kMemoryHeadDim})));
  return bytes.peak();
}

class ContextMemoryTest : public DistTest {};

TEST_F(ContextMemoryTest, FourRanksHoldAtMostAThirdOfOneProcess) {
  at::set_num_threads(1);
  const MeshPtr cp = mesh({4}, {}, {"cp"});
  const int64_t kv_heads = 4;
  const int64_t own = cp->local_rank(0) == 0 ? peak_of_attention(kPositions, kv_heads, [](at::Tensor t) { return t; }) : 0;
  const int64_t whole = cp->world()->sum_across_ranks(own);
  for (const auto method : {ContextParallelAttention::Ring, ContextParallelAttention::AllToAll}) {
    set_context_parallel_attention(method);
    const int64_t mine =
        peak_of_attention(kPositions / 4, kv_heads, [&](at::Tensor t) { return from_local(t, cp, {Shard(2)}, {.run_check = false}); });
    const double ratio = static_cast<double>(mine) / static_cast<double>(whole);
    const char* name = method == ContextParallelAttention::Ring ? "ring" : "all-to-all";
    std::printf("rank %lld, %s: peak %lld bytes against one process's %lld: %.3fx\n", static_cast<long long>(cp->local_rank(0)), name,
                static_cast<long long>(mine), static_cast<long long>(whole), ratio);
    // Gloo's frees on its own thread escape the counter (above): its all-to-all figure is no measure.
    if (method == ContextParallelAttention::AllToAll && cp->backend_description().backend == CommBackend::Gloo) continue;
    EXPECT_LE(ratio, 0.33) << name;
  }
  set_context_parallel_attention(ContextParallelAttention::Auto);
}

}  // namespace
}  // namespace dtensor::testing
