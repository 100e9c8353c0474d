#pragma once
// Ring attention: scaled dot-product attention whose queries, keys and values are sharded along the
// sequence over a mesh dim (context parallelism), each rank holding its torch.chunk block of the
// positions. Key/value blocks travel around the ring (rank r sends to r+1 and receives from r-1) while
// each rank attends its queries to the block it holds, the next transfer in flight meanwhile; the
// blocks' outputs merge exactly by their logsumexp (the online-softmax update). The backward sends the
// blocks around again, with their key and value gradients following one step behind and coming home
// at the end; each block's share is the CPU flash kernel's backward with the merged output and
// logsumexp, which normalise the block's probabilities over all keys.
//
// Causal attention needs query and key positions alike (one sequence): a block of earlier positions
// is attended whole, the rank's own block causally, later ones not at all. Keys may have fewer heads
// than queries (grouped-query attention), as the CPU kernel allows. No dropout, no mask beyond the
// causal one.

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "dtensor/device_mesh.h"

namespace dtensor::detail {

struct RingAttention {
  MeshPtr mesh;
  int64_t dim = 0;          // the mesh dim the sequence is sharded over
  int64_t length = 0;       // the global sequence length (queries and keys)
  bool is_causal = false;
  std::optional<double> scale;
};

// q [batch, heads, this rank's positions, head dim], k and v [batch, kv heads, the same positions,
// head dim] -> (output shaped like q, logsumexp [batch, heads, positions], in float for reduced
// precision, as the CPU kernel's).
std::tuple<at::Tensor, at::Tensor> ring_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                          const RingAttention& call);

// The gradients of q, k and v (this rank's blocks) from the output's, given the forward's output and
// logsumexp.
std::tuple<at::Tensor, at::Tensor, at::Tensor> ring_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                                                       const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                                       const RingAttention& call);

}  // namespace dtensor::detail
