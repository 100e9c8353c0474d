#pragma once
// Context-parallel attention: scaled dot-product attention whose queries, keys and values are sharded
// along the sequence over a mesh dim, each rank holding its torch.chunk block of the positions, by one
// of two methods.
//
// Ring (ring_attention.cpp): key/value blocks travel around the ring (rank r sends to r+1 and receives from r-1) while
// each rank attends its queries to the block it holds, the next transfer in flight meanwhile; the
// blocks' outputs merge exactly by their logsumexp (the online-softmax update). The backward sends the
// blocks around again, with their key and value gradients following one step behind and coming home
// at the end; each block's share is the CPU flash kernel's backward with the merged output and
// logsumexp, which normalise the block's probabilities over all keys.
//
// Causal attention needs query and key positions alike (one sequence): a block of earlier positions
// is attended whole, the rank's own block causally, later ones not at all.
//
// All-to-all (DeepSpeed-Ulysses; all_to_all_attention.cpp): one all-to-all per tensor trades the
// sequence shard for a head shard (each rank all positions of its heads), attention runs locally, and
// another trades the output (and logsumexp; in backward the gradients) back. Heads of queries and of
// keys must divide by the ranks. Its backward runs in two halves of the heads where they split, so that
// a rank holds half the head groups at a time.
//
// Both: keys may have fewer heads than queries (grouped-query attention, which the CPU kernels take
// as it is; fewer heads travel); no
// dropout, no mask beyond the causal one.
//
// Load balancing (sequence_runs in dtensor/layout.h: rank r holds chunks r and 2n-1-r of 2n): the
// order is the data's, and whoever shards the sequence so (context_parallel) says so for the call.

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/layout.h"

namespace dtensor::detail {

struct ContextAttention {
  MeshPtr mesh;
  int64_t dim = 0;          // the mesh dim the sequence is sharded over
  int64_t length = 0;       // the global sequence length (queries and keys)
  bool is_causal = false;
  std::optional<double> scale;
  bool load_balanced = false;  // each rank's block is head-tail (above)
};

// The runs of `rank`'s block (sequence_runs, dtensor/layout.h): one, or two when load balanced.
std::vector<SequenceRun> sequence_runs(const ContextAttention& call, int64_t rank);
// Where each position sits among the ranks' blocks back to back (sequence_order_of_blocks).
std::vector<int64_t> sequence_order_of_blocks(const ContextAttention& call);

// q [batch, heads, this rank's positions, head dim], k and v [batch, kv heads, the same positions,
// head dim] -> (output shaped like q, logsumexp [batch, heads, positions], in float for reduced
// precision, as the CPU kernel's).
std::tuple<at::Tensor, at::Tensor> ring_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                          const ContextAttention& call);

// The gradients of q, k and v (this rank's blocks) from the output's, given the forward's output and
// logsumexp.
std::tuple<at::Tensor, at::Tensor, at::Tensor> ring_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                                                       const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                                       const ContextAttention& call);

// The same, by all-to-all.
std::tuple<at::Tensor, at::Tensor> all_to_all_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                                const ContextAttention& call);
std::tuple<at::Tensor, at::Tensor, at::Tensor> all_to_all_attention_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                                             const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                                                             const at::Tensor& lse, const ContextAttention& call);

// Refuses all-to-all attention where the heads of queries or keys do not divide by the ranks of the
// mesh dim, naming `caller`, the mesh dim and the heads.
void check_all_to_all_heads(int64_t query_heads, int64_t kv_heads, const DeviceMesh& mesh, int64_t dim, const std::string& caller);

// The layouts of the CPU flash kernels' results, which the rules give their outputs (rules/attention.cpp)
// and graph programs rely on (a view of the output transposed back is a view only in that layout): the
// output laid out like the queries (empty_like), the logsumexp and the gradients [batch, positions,
// heads(, head dim)] in memory. Each returns `t` where it is laid out so already, else a copy that is.
at::Tensor laid_out_like_queries(const at::Tensor& t, const at::Tensor& q);
at::Tensor laid_out_heads_last(const at::Tensor& t);
// An empty tensor of `sizes` laid out heads-last, as above.
at::Tensor empty_heads_last(at::IntArrayRef sizes, const at::TensorOptions& options);

// Gradient buffers of queries, keys and values ([batch, heads, positions, head dim], last dim dense).
struct FlashGradients {
  at::Tensor q, k, v;
};
// The CPU flash kernel's backward (_scaled_dot_product_flash_attention_for_cpu_backward's, no dropout or
// mask) adding the gradients into `grads` instead of returning new ones (context_attention.cpp).
void add_flash_attention_backward(const FlashGradients& grads, const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool is_causal,
                                  std::optional<double> scale);

// Checks the blocks a rank holds (shapes, positions, heads), naming the method, mesh dim and rank.
void check_context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextAttention& call, const char* method);

}  // namespace dtensor::detail
