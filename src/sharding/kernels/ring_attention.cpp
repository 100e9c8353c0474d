#include "context_attention.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dtensor/layout.h"
#include "dtensor/p2p.h"

namespace dtensor::detail {
namespace {

// How a run of keys meets a run of queries: in causal attention a run of earlier positions is attended
// whole, the same run causally, a later one not at all.
enum class Visibility { None, Causal, Whole };

Visibility visibility(bool is_causal, const SequenceRun& queries, const SequenceRun& keys) {
  if (!is_causal || keys.chunk < queries.chunk) return Visibility::Whole;
  return keys.chunk == queries.chunk ? Visibility::Causal : Visibility::None;
}

// A pair of runs that meet: the queries' and the keys' places in their blocks, and how they meet.
struct Meeting {
  SequenceRun queries, keys;
  bool causal;
};

// The ring on the call's mesh dim, from this rank's place on it.
struct Ring {
  const ContextAttention& call;
  int64_t size, rank;
  std::vector<SequenceRun> own;  // this rank's runs of queries

  explicit Ring(const ContextAttention& c)
      : call(c), size(c.mesh->size(c.dim)), rank(c.mesh->local_rank(c.dim)), own(sequence_runs(c, rank)) {}
  int64_t next() const { return (rank + 1) % size; }
  int64_t previous() const { return (rank + size - 1) % size; }
  // The rank whose block this rank holds after `steps` passes.
  int64_t owner_after(int64_t steps) const { return ((rank - steps) % size + size) % size; }
  int64_t positions_of(int64_t owner) const { return chunk_extent(call.length, size, owner).size; }
  // Where this rank's queries meet the keys of `owner`'s block (none empty).
  std::vector<Meeting> meetings(int64_t owner) const {
    std::vector<Meeting> out;
    for (const SequenceRun& keys : sequence_runs(call, owner))
      for (const SequenceRun& queries : own) {
        const Visibility seen = visibility(call.is_causal, queries, keys);
        if (seen != Visibility::None && queries.size > 0 && keys.size > 0) out.push_back({queries, keys, seen == Visibility::Causal});
      }
    return out;
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

// Zeros shaped like `like` ([batch, heads, positions, head dim]) laid out [batch, positions, heads,
// head dim], as the CPU kernel's gradients are (a gradient laid out otherwise is copied into that
// layout when it becomes a DTensor's shard).
at::Tensor heads_last_zeros(const at::Tensor& like, at::ScalarType dtype) {
  return at::zeros({like.size(0), like.size(2), like.size(1), like.size(3)}, like.options().dtype(dtype)).transpose(1, 2);
}

at::Tensor run_of(const at::Tensor& t, const SequenceRun& s) { return t.narrow(2, s.local_offset, s.size); }

// The backward kernel's buffers and gradients grow with its queries: a meeting's queries are taken in
// pieces of at most this many positions, which bounds them (the keys' gradients add up over pieces).
constexpr int64_t kBackwardQueryPiece = 1024;

// Grouped-query attention's backward kernel makes its key and value gradients at the queries' heads
// before summing them onto the kv heads: run per kv head (with its group of query heads), it makes
// them at one group's heads.
struct HeadGroup {
  int64_t query_head, query_heads, kv_head, kv_heads;
};

std::vector<HeadGroup> head_groups(int64_t query_heads, int64_t kv_heads) {
  if (kv_heads == query_heads) return {{0, query_heads, 0, kv_heads}};
  const int64_t group = query_heads / kv_heads;
  std::vector<HeadGroup> groups;
  for (int64_t h = 0; h < kv_heads; ++h) groups.push_back({h * group, group, h, 1});
  return groups;
}

// A meeting as meetings of at most kBackwardQueryPiece queries each. Causal ones are cut only where
// queries and keys are one run: a piece of it sees its own positions causally and the earlier ones of
// the run whole, which is the run's causal attention over keys up to the piece's end.
std::vector<Meeting> in_query_pieces(const Meeting& m) {
  std::vector<Meeting> pieces;
  for (int64_t start = 0; start < m.queries.size; start += kBackwardQueryPiece) {
    const int64_t size = std::min(kBackwardQueryPiece, m.queries.size - start);
    SequenceRun queries{m.queries.chunk, m.queries.global_offset + start, m.queries.local_offset + start, size};
    if (!m.causal) {
      pieces.push_back({queries, m.keys, false});
      continue;
    }
    // Keys before the piece, whole; the piece's own positions, causally.
    if (start > 0) pieces.push_back({queries, {m.keys.chunk, m.keys.global_offset, m.keys.local_offset, start}, false});
    pieces.push_back({queries, {m.keys.chunk, m.keys.global_offset + start, m.keys.local_offset + start, size}, true});
  }
  return pieces;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> ring_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                          const ContextAttention& call) {
  check_context_attention(q, k, v, call, "ring attention");
  const Ring ring(call);
  const at::ScalarType accumulate = at::toOpMathType(q.scalar_type());
  at::Tensor out = at::zeros_like(q, q.options().dtype(accumulate));  // laid out as the kernel's (laid_out_like_queries)
  at::Tensor lse = at::full({q.size(0), q.size(2), q.size(1)}, -std::numeric_limits<double>::infinity(), q.options().dtype(accumulate)).transpose(1, 2);
  std::vector<at::Tensor> block{k.contiguous(), v.contiguous()};
  for (int64_t step = 0; step < ring.size; ++step) {
    std::pair<P2PWork, std::vector<at::Tensor>> next_block;  // in flight while this one is attended
    if (step + 1 < ring.size) next_block = ring.pass_on(block, step, "a key/value block");
    for (const Meeting& m : ring.meetings(ring.owner_after(step))) {
      auto [part_out, part_lse] = at::_scaled_dot_product_flash_attention_for_cpu(run_of(q, m.queries), run_of(block[0], m.keys),
                                                                                  run_of(block[1], m.keys), 0.0, m.causal, {}, call.scale);
      // The online-softmax merge, in place: both parts reweighed to the joint normaliser.
      at::Tensor run_out = run_of(out, m.queries), run_lse = lse.narrow(2, m.queries.local_offset, m.queries.size);
      const at::Tensor part = part_lse.to(accumulate), merged = at::logaddexp(run_lse, part);
      run_out.mul_(at::exp(run_lse - merged).unsqueeze(-1)).addcmul_(part_out, at::exp(part - merged).unsqueeze(-1));
      run_lse.copy_(merged);
    }
    if (step + 1 < ring.size) {
      next_block.first.wait();
      block = std::move(next_block.second);
    }
  }
  return {laid_out_like_queries(out.to(q.scalar_type()), q), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ring_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                                                       const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                                       const ContextAttention& call) {
  check_context_attention(q, k, v, call, "ring attention");
  const Ring ring(call);
  const at::ScalarType accumulate = at::toOpMathType(q.scalar_type());
  at::Tensor grad_q = heads_last_zeros(q, accumulate);
  std::vector<at::Tensor> block{k.contiguous(), v.contiguous()};
  // The block's key and value gradients, following it one step behind.
  std::vector<at::Tensor> block_grads{at::zeros(k.sizes(), k.options().dtype(accumulate)), at::zeros(v.sizes(), v.options().dtype(accumulate))};
  P2PWork grads_arriving;
  std::vector<at::Tensor> grads_in_flight;
  for (int64_t step = 0; step < ring.size; ++step) {
    std::pair<P2PWork, std::vector<at::Tensor>> next_block;  // in flight while this one is attended
    if (step + 1 < ring.size) next_block = ring.pass_on(block, step, "a key/value block");
    grads_arriving.wait();
    grads_in_flight.clear();  // sent: their memory serves the step's kernels
    for (const Meeting& meeting : ring.meetings(ring.owner_after(step)))
      for (const Meeting& m : in_query_pieces(meeting))
        for (const HeadGroup& g : head_groups(q.size(1), k.size(1))) {
          const auto queries = [&](const at::Tensor& t) { return run_of(t, m.queries).narrow(1, g.query_head, g.query_heads); };
          const auto keys = [&](const at::Tensor& t) { return run_of(t, m.keys).narrow(1, g.kv_head, g.kv_heads); };
          auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
              queries(grad_out), queries(q), keys(block[0]), keys(block[1]), queries(out),
              lse.narrow(2, m.queries.local_offset, m.queries.size).narrow(1, g.query_head, g.query_heads), 0.0, m.causal, {}, call.scale);
          queries(grad_q).add_(dq);
          keys(block_grads[0]).add_(dk);
          keys(block_grads[1]).add_(dv);
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
  return {grad_q.to(q.scalar_type()), heads_last_zeros(k, k.scalar_type()).copy_(block_grads[0]),
          heads_last_zeros(v, v.scalar_type()).copy_(block_grads[1])};
}

}  // namespace dtensor::detail
