#pragma once
// Context parallelism for a model written on plain tensors, as PyTorch's context_parallel: the
// sequence of every buffer the model reads (tokens, position ids, labels, rotary tables) is sharded
// over a 1-d mesh, the model runs on each rank's positions, and only attention sees the whole
// sequence, through a module whose forward(q, k, v) calls scaled_dot_product_attention and that the
// plan gives context_parallel_attention_style(): its q, k and v become DTensors sharded along the sequence,
// which attention's rules run as ring or all-to-all attention (sharding.h), and its output comes back
// local. Parameters stay whole on every rank; their gradients are each rank's positions' share, to be
// summed over the mesh as data parallelism sums them.
//
// With load balancing (the default), the sequence is cut into 2n equal chunks and rank r holds chunks
// r and 2n-1-r (head-tail), so that causal attention costs every rank alike. That order is the data's,
// as in PyTorch: a DTensor made of such shards as Shard gathers (full_tensor) to the reordered sequence,
// and context_parallel_unshard gathers it back into order. Placed HeadTailShard(seq_dim) instead
// (dtensor/placement.h), the same shards gather in order, redistribute, and run attention load
// balanced without this scope.

#include <ATen/core/Tensor.h>

#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/parallel_style.h"

namespace dtensor {

struct ContextParallelOptions {
  bool load_balance = true;
};

// This rank's positions of `whole` along `seq_dim` over the 1-d `mesh`: its torch.chunk piece, or its
// head-tail chunks when load balanced (refused unless the length is a multiple of 2n, naming the mesh
// dim and what to do).
at::Tensor context_parallel_shard(const at::Tensor& whole, const DeviceMesh& mesh, int64_t seq_dim, const ContextParallelOptions& options = {});
// The whole sequence from every rank's positions (a collective over `mesh`), in order.
at::Tensor context_parallel_unshard(const at::Tensor& local, const MeshPtr& mesh, int64_t seq_dim, const ContextParallelOptions& options = {});

// While alive: every tensor of `buffers` holds this rank's positions along its seq_dims entry instead
// of the whole sequence (in place: a module's buffer stays the module's, for parameters use the
// model's inputs), and context-parallel attention reads the order it was sharded in
// (set_context_parallel_load_balance). Run forward and backward inside. Buffers must share one
// sequence length (position ids sharded like the tokens); anything else is refused, naming the buffer.
// The destructor puts the whole sequences back.
class ContextParallel {
 public:
  ContextParallel(MeshPtr mesh, std::vector<at::Tensor> buffers, std::vector<int64_t> seq_dims, ContextParallelOptions options = {});
  ~ContextParallel();
  ContextParallel(const ContextParallel&) = delete;
  ContextParallel& operator=(const ContextParallel&) = delete;

 private:
  MeshPtr mesh_;
  std::vector<at::Tensor> buffers_, wholes_;  // the buffers, and tensors aliasing their whole storage
  bool previous_load_balance_;
};

// The plan entry for the module that calls attention: forward(q, k, v) with q, k and v [batch, heads,
// this rank's positions, head dim] (plain, as the model computes them on its positions) read as
// Shard(2) of the whole sequence, and the output back on this rank's positions. Apply it with the
// context-parallel mesh (parallelize_module) that the ContextParallel scope is given: inside the scope
// the sequence's length is the scope's, uneven torch.chunk blocks included; outside one, plain shards
// are taken to be even (pass uneven ones in as DTensors).
PrepareModuleInputOutput context_parallel_attention_style();

}  // namespace dtensor
