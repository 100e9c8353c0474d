#include "context_attention.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dtensor/layout.h"
#include "dtensor/p2p.h"

namespace dtensor::detail {
namespace {

// How a block of keys (held first by rank `owner`) meets this rank's queries.
enum class Visibility { None, Causal, Whole };

// The ring on the call's mesh dim, from this rank's place on it.
struct Ring {
  const ContextAttention& call;
  int64_t size, rank;

  explicit Ring(const ContextAttention& c) : call(c), size(c.mesh->size(c.dim)), rank(c.mesh->local_rank(c.dim)) {}
  int64_t next() const { return (rank + 1) % size; }
  int64_t previous() const { return (rank + size - 1) % size; }
  // The rank whose block this rank holds after `steps` passes.
  int64_t owner_after(int64_t steps) const { return ((rank - steps) % size + size) % size; }
  int64_t positions_of(int64_t owner) const { return chunk_extent(call.length, size, owner).size; }
  Visibility visibility(int64_t owner) const {
    if (!call.is_causal || owner < rank) return Visibility::Whole;
    return owner == rank ? Visibility::Causal : Visibility::None;
  }
  // Starts passing `tensors` (a block, or its gradients) on to the next rank and receiving the previous
  // rank's, which belong to the block this rank holds after `step + 1` passes: the transfer, and where
  // they arrive.
  std::pair<P2PWork, std::vector<at::Tensor>> pass_on(const std::vector<at::Tensor>& tensors, int64_t step, const std::string& what) const {
    const int64_t positions = positions_of(owner_after(step + 1));
    std::vector<at::Tensor> arriving;
    std::vector<P2POp> ops;
    for (const at::Tensor& t : tensors) {
      arriving.push_back(at::empty({t.size(0), t.size(1), positions, t.size(3)}, t.options()));
      ops.push_back({P2POp::Kind::Send, t, next(), "ring attention: " + what + " to the next rank"});
      ops.push_back({P2POp::Kind::Recv, arriving.back(), previous(), "ring attention: " + what + " from the previous rank"});
    }
    return {batch_isend_irecv(call.mesh, call.dim, std::move(ops)), std::move(arriving)};
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> ring_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                          const ContextAttention& call) {
  check_context_attention(q, k, v, call, "ring attention");
  const Ring ring(call);
  const at::ScalarType accumulate = at::toOpMathType(q.scalar_type());
  at::Tensor out = at::zeros(q.sizes(), q.options().dtype(accumulate));
  at::Tensor lse = at::full({q.size(0), q.size(1), q.size(2)}, -std::numeric_limits<double>::infinity(), q.options().dtype(accumulate));
  std::vector<at::Tensor> block{k.contiguous(), v.contiguous()};
  for (int64_t step = 0; step < ring.size; ++step) {
    const int64_t owner = ring.owner_after(step);
    std::pair<P2PWork, std::vector<at::Tensor>> next_block;  // in flight while this one is attended
    if (step + 1 < ring.size) next_block = ring.pass_on(block, step, "a key/value block");
    const Visibility seen = ring.visibility(owner);
    if (seen != Visibility::None && q.size(2) > 0 && block[0].size(2) > 0) {
      auto [block_out, block_lse] = at::_scaled_dot_product_flash_attention_for_cpu(
          q, with_query_heads(block[0], q.size(1)), with_query_heads(block[1], q.size(1)), 0.0, seen == Visibility::Causal, {}, call.scale);
      // The online-softmax merge: both parts reweighed to the joint normaliser.
      const at::Tensor merged = at::logaddexp(lse, block_lse.to(accumulate));
      out = out * at::exp(lse - merged).unsqueeze(-1) + block_out.to(accumulate) * at::exp(block_lse.to(accumulate) - merged).unsqueeze(-1);
      lse = merged;
    }
    if (step + 1 < ring.size) {
      next_block.first.wait();
      block = std::move(next_block.second);
    }
  }
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ring_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                                                       const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                                       const ContextAttention& call) {
  check_context_attention(q, k, v, call, "ring attention");
  const Ring ring(call);
  const at::ScalarType accumulate = at::toOpMathType(q.scalar_type());
  at::Tensor grad_q = at::zeros(q.sizes(), q.options().dtype(accumulate));
  std::vector<at::Tensor> block{k.contiguous(), v.contiguous()};
  // The block's key and value gradients, following it one step behind.
  std::vector<at::Tensor> block_grads{at::zeros(k.sizes(), k.options().dtype(accumulate)), at::zeros(v.sizes(), v.options().dtype(accumulate))};
  P2PWork grads_arriving;
  std::vector<at::Tensor> grads_in_flight;
  for (int64_t step = 0; step < ring.size; ++step) {
    const int64_t owner = ring.owner_after(step);
    std::pair<P2PWork, std::vector<at::Tensor>> next_block;  // in flight while this one is attended
    if (step + 1 < ring.size) next_block = ring.pass_on(block, step, "a key/value block");
    grads_arriving.wait();
    const Visibility seen = ring.visibility(owner);
    if (seen != Visibility::None && q.size(2) > 0 && block[0].size(2) > 0) {
      auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
          grad_out, q, with_query_heads(block[0], q.size(1)), with_query_heads(block[1], q.size(1)), out, lse, 0.0, seen == Visibility::Causal, {},
          call.scale);
      grad_q.add_(dq);
      block_grads[0].add_(onto_kv_heads(dk, k.size(1)));
      block_grads[1].add_(onto_kv_heads(dv, v.size(1)));
    }
    // The gradients go on with the block (after the last step, home to their owner); what is sent stays
    // alive until the transfer completes.
    if (ring.size > 1) {
      grads_in_flight = block_grads;
      std::tie(grads_arriving, block_grads) = ring.pass_on(block_grads, step, "a key/value block's gradients");
    }
    if (step + 1 < ring.size) {
      next_block.first.wait();
      block = std::move(next_block.second);
    }
  }
  grads_arriving.wait();
  return {grad_q.to(q.scalar_type()), block_grads[0].to(k.scalar_type()), block_grads[1].to(v.scalar_type())};
}

}  // namespace dtensor::detail
