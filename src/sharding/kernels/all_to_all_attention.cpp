#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "../../mesh/collectives.h"
#include "context_attention.h"
#include "dtensor/errors.h"
#include "dtensor/layout.h"

namespace dtensor::detail {
namespace {

constexpr int64_t kHeadsAxis = 1, kSequenceAxis = 2;

// The exchanges along the call's mesh dim between sequence blocks and head groups.
struct Exchange {
  const ContextAttention& call;
  int64_t ranks, rank;

  explicit Exchange(const ContextAttention& c) : call(c), ranks(c.mesh->size(c.dim)), rank(c.mesh->local_rank(c.dim)) {}

  // [batch, heads, this rank's positions, ...] -> [batch, its group of heads, every position, ...].
  at::Tensor to_heads(const at::Tensor& x) const {
    const int64_t group = x.size(kHeadsAxis) / ranks;
    std::vector<at::Tensor> pieces;
    std::vector<Shape> arriving;
    for (int64_t member = 0; member < ranks; ++member) {
      pieces.push_back(x.narrow(kHeadsAxis, member * group, group));
      Shape shape = x.sizes().vec();
      shape[kHeadsAxis] = group;
      shape[kSequenceAxis] = chunk_extent(call.length, ranks, member).size;
      arriving.push_back(shape);
    }
    return in_sequence_order(joined(all_to_all_pieces(*call.mesh, call.dim, pieces, arriving), arriving, kSequenceAxis));
  }

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

  // The way back: [batch, a group of heads, every position, ...] -> [batch, heads, this rank's positions, ...].
  at::Tensor to_sequence(const at::Tensor& x) const {
    const int64_t positions = chunk_extent(call.length, ranks, rank).size;
    std::vector<at::Tensor> pieces;
    std::vector<Shape> arriving;
    for (int64_t member = 0; member < ranks; ++member) {
      pieces.push_back(block_of(x, member));
      Shape shape = x.sizes().vec();
      shape[kSequenceAxis] = positions;
      arriving.push_back(shape);
    }
    return joined(all_to_all_pieces(*call.mesh, call.dim, pieces, arriving), arriving, kHeadsAxis);
  }

  // What an all-to-all delivered (flat, member after member) as one tensor: the members' pieces joined
  // along `dim`.
  static at::Tensor joined(const at::Tensor& flat, const std::vector<Shape>& shapes, int64_t dim) {
    std::vector<at::Tensor> pieces;
    int64_t offset = 0;
    for (const Shape& shape : shapes) {
      const int64_t n = numel(shape);
      pieces.push_back(flat.narrow(0, offset, n).view(shape));
      offset += n;
    }
    return at::cat(pieces, dim);
  }
};

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
  return {laid_out_like_queries(exchange.to_sequence(out), q), laid_out_heads_last(exchange.to_sequence(lse))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> all_to_all_attention_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                                             const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                                                             const at::Tensor& lse, const ContextAttention& call) {
  check_context_attention(q, k, v, call, "all-to-all attention");
  check_all_to_all_heads(q.size(kHeadsAxis), k.size(kHeadsAxis), *call.mesh, call.dim, "all-to-all attention");
  const Exchange exchange(call);
  auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      exchange.to_heads(grad_out), exchange.to_heads(q), exchange.to_heads(k), exchange.to_heads(v), exchange.to_heads(out), exchange.to_heads(lse),
      0.0, call.is_causal, {}, call.scale);
  return {laid_out_heads_last(exchange.to_sequence(dq)), laid_out_heads_last(exchange.to_sequence(dk)), laid_out_heads_last(exchange.to_sequence(dv))};
}

}  // namespace dtensor::detail
