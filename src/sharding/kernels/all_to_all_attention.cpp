#include <ATen/ATen.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../../mesh/collectives.h"
#include "context_attention.h"
#include "dtensor/errors.h"
#include "dtensor/layout.h"

namespace dtensor::detail {
namespace {

constexpr int64_t kHeadsAxis = 1, kSequenceAxis = 2;

// Heads [first, first + count) of each member's group of heads.
struct HeadRange {
  int64_t first, count;
};

// The exchanges along the call's mesh dim between sequence blocks and head groups. Pieces travel with
// their sequence axis first ([positions, batch, heads, ...]), so that what arrives is laid out to be
// used in place: the members' blocks back to back make the whole sequence of a head group without a
// copy, and the head groups go straight into the result's layout with one. Memory is what this method
// spends (each rank holds its blocks and their head groups at once), so no exchange holds a third copy.
struct Exchange {
  const ContextAttention& call;
  int64_t ranks, rank;

  explicit Exchange(const ContextAttention& c) : call(c), ranks(c.mesh->size(c.dim)), rank(c.mesh->local_rank(c.dim)) {}

  // [batch, heads, this rank's positions, ...] -> [batch, heads [first, first + count) of its group of
  // heads, every position, ...] (a view of what arrived, sequence axis outermost in memory; the CPU
  // kernels read strides).
  at::Tensor to_heads(const at::Tensor& x, HeadRange heads) const {
    const int64_t group = x.size(kHeadsAxis) / ranks;
    std::vector<at::Tensor> pieces;
    std::vector<Shape> arriving;
    for (int64_t member = 0; member < ranks; ++member) {
      pieces.push_back(x.narrow(kHeadsAxis, member * group + heads.first, heads.count).movedim(kSequenceAxis, 0));
      Shape shape = pieces.back().sizes().vec();
      shape[0] = chunk_extent(call.length, ranks, member).size;
      arriving.push_back(shape);
    }
    Shape whole = arriving.front();
    whole[0] = call.length;
    const at::Tensor arrived = all_to_all_pieces(*call.mesh, call.dim, pieces, arriving).view(whole).movedim(0, kSequenceAxis);
    return in_sequence_order(arrived);
  }
  at::Tensor to_heads(const at::Tensor& x) const { return to_heads(x, whole_group(x)); }
  HeadRange whole_group(const at::Tensor& x) const { return {0, x.size(kHeadsAxis) / ranks}; }

  // The members' blocks back to back ([batch, heads, every position, ...]) in the sequence's order: the
  // same unless load balanced, where the runs are gathered into order.
  at::Tensor in_sequence_order(const at::Tensor& members_blocks) const {
    if (!call.load_balanced) return members_blocks;
    return members_blocks.index_select(kSequenceAxis, at::tensor(sequence_order_of_blocks(call), at::kLong));
  }

  // A member's block of every position in the sequence's order.
  at::Tensor block_of(const at::Tensor& x, int64_t member) const {
    std::vector<at::Tensor> runs;
    for (const SequenceRun& run : sequence_runs(call, member)) runs.push_back(x.narrow(kSequenceAxis, run.global_offset, run.size));
    return runs.size() == 1 ? runs.front() : at::cat(runs, kSequenceAxis);
  }

  // The way back: [batch, a group of heads, every position, ...] -> `into` [batch, heads, this rank's
  // positions, ...], in whatever layout `into` has.
  at::Tensor to_sequence(const at::Tensor& x, at::Tensor into) const {
    const int64_t positions = chunk_extent(call.length, ranks, rank).size;
    std::vector<at::Tensor> pieces;
    std::vector<Shape> arriving;
    for (int64_t member = 0; member < ranks; ++member) {
      pieces.push_back(block_of(x, member).movedim(kSequenceAxis, 0));
      Shape shape = pieces.back().sizes().vec();
      shape[0] = positions;
      arriving.push_back(shape);
    }
    // Arrived: [members, positions, batch, group, ...]; wanted: [batch, members x group, positions, ...].
    Shape members_first = arriving.front();
    members_first.insert(members_first.begin(), ranks);
    std::vector<int64_t> order = {2, 0, 3, 1};
    for (int64_t d = 4; d < static_cast<int64_t>(members_first.size()); ++d) order.push_back(d);
    const at::Tensor arrived = all_to_all_pieces(*call.mesh, call.dim, pieces, arriving).view(members_first);
    into.unflatten(kHeadsAxis, {ranks, x.size(kHeadsAxis)}).copy_(arrived.permute(order));
    return into;
  }
};

// The heads of a rank's group that one pass of the backward takes.
struct BackwardPass {
  HeadRange q, kv;
  bool shares_kv_with_previous;
};

// The backward runs in two halves of the group where its heads split so, each exchanging and attending
// half the group's heads, its kernel adding into the group's gradients: a rank then holds its blocks,
// the group's gradients and half its head groups at once, where one pass held all the head groups
// (CP=4, 8 query and 4 key/value heads at 8192 positions: 0.316x of one process's peak instead of
// 0.369x). Keys and values are shared by both halves when the group has one of them; the query heads of
// a half use only its half of them otherwise, as grouped-query attention pairs them.
std::vector<BackwardPass> backward_passes(int64_t q_group, int64_t kv_group) {
  if (q_group % 2 != 0 || (kv_group != 1 && kv_group % 2 != 0)) return {{{0, q_group}, {0, kv_group}, false}};
  const int64_t q_half = q_group / 2;
  if (kv_group == 1) return {{{0, q_half}, {0, 1}, false}, {{q_half, q_half}, {0, 1}, true}};
  const int64_t kv_half = kv_group / 2;
  return {{{0, q_half}, {0, kv_half}, false}, {{q_half, q_half}, {kv_half, kv_half}, false}};
}

}  // namespace

void check_all_to_all_heads(int64_t query_heads, int64_t kv_heads, const DeviceMesh& mesh, int64_t dim, const std::string& caller) {
  const int64_t ranks = mesh.size(dim);
  if (query_heads % ranks != 0 || kv_heads % ranks != 0)
    throw DTensorError(caller + ": all-to-all context-parallel attention over " + mesh.dim_label(dim) + " (" + std::to_string(ranks) +
                       " ranks) needs heads that divide by the ranks, but has " + std::to_string(query_heads) + " query and " +
                       std::to_string(kv_heads) + " key/value heads; use ring attention (set_context_parallel_attention)");
}

std::tuple<at::Tensor, at::Tensor> all_to_all_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                                const ContextAttention& call) {
  check_context_attention(q, k, v, call, "all-to-all attention");
  check_all_to_all_heads(q.size(kHeadsAxis), k.size(kHeadsAxis), *call.mesh, call.dim, "all-to-all attention");
  const Exchange exchange(call);
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(exchange.to_heads(q), exchange.to_heads(k), exchange.to_heads(v), 0.0,
                                                                    call.is_causal, {}, call.scale);
  at::Tensor local_out = exchange.to_sequence(out, at::empty_like(q, out.options()));
  out.reset();  // before the logsumexp's exchange
  Shape lse_sizes = q.sizes().vec();
  lse_sizes.pop_back();
  return {std::move(local_out), exchange.to_sequence(lse, empty_heads_last(lse_sizes, lse.options()))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> all_to_all_attention_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                                             const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                                                             const at::Tensor& lse, const ContextAttention& call) {
  check_context_attention(q, k, v, call, "all-to-all attention");
  check_all_to_all_heads(q.size(kHeadsAxis), k.size(kHeadsAxis), *call.mesh, call.dim, "all-to-all attention");
  const Exchange exchange(call);
  // The group's gradients, which every pass's kernel adds into.
  const auto group_zeros = [&](const at::Tensor& like) {
    Shape sizes = like.sizes().vec();
    sizes[kHeadsAxis] = exchange.whole_group(like).count;
    sizes[kSequenceAxis] = call.length;
    return empty_heads_last(sizes, like.options()).zero_();
  };
  at::Tensor dq = group_zeros(q), dk = group_zeros(k), dv = group_zeros(v);
  const std::vector<BackwardPass> passes = backward_passes(dq.size(kHeadsAxis), dk.size(kHeadsAxis));
  at::Tensor k_heads, v_heads;  // kept for the next pass where it shares them
  for (const BackwardPass& pass : passes) {
    if (!pass.shares_kv_with_previous) k_heads = v_heads = at::Tensor();  // the previous pass's, before any exchange
    // The largest first: each exchange briefly holds its piece twice, and the last one's peak is the
    // method's. The head groups are dropped as soon as the kernel is done with them.
    const at::Tensor grad_heads = exchange.to_heads(grad_out, pass.q), q_heads = exchange.to_heads(q, pass.q);
    const at::Tensor out_heads = exchange.to_heads(out, pass.q);
    if (!pass.shares_kv_with_previous) {
      k_heads = exchange.to_heads(k, pass.kv);
      v_heads = exchange.to_heads(v, pass.kv);
    }
    const auto queries = [&](const at::Tensor& t) { return t.narrow(kHeadsAxis, pass.q.first, pass.q.count); };
    const auto kv = [&](const at::Tensor& t) { return t.narrow(kHeadsAxis, pass.kv.first, pass.kv.count); };
    add_flash_attention_backward({queries(dq), kv(dk), kv(dv)}, grad_heads, q_heads, k_heads, v_heads, out_heads,
                                 exchange.to_heads(lse, pass.q), call.is_causal, call.scale);
  }
  k_heads.reset();
  v_heads.reset();
  // Each gradient's head group is dropped once it has gone back.
  const auto back = [&](at::Tensor& heads, const at::Tensor& like) {
    at::Tensor local = exchange.to_sequence(heads, empty_heads_last(like.sizes(), heads.options()));
    heads.reset();
    return local;
  };
  at::Tensor local_dq = back(dq, q), local_dk = back(dk, k);
  return {std::move(local_dq), std::move(local_dk), back(dv, v)};
}

}  // namespace dtensor::detail
