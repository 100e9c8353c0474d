#include "context_attention.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "dtensor/errors.h"
#include "dtensor/layout.h"

namespace dtensor::detail {

void check_context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextAttention& call, const char* method) {
  const int64_t ranks = call.mesh->size(call.dim), rank = call.mesh->local_rank(call.dim);
  const std::string where = std::string(" (") + method + " over " + call.mesh->dim_label(call.dim) + ", rank " + std::to_string(rank) +
                            " of " + std::to_string(ranks) + ")";
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    throw DTensorError("context-parallel attention: query, key and value must be [batch, heads, positions, head dim]" + where);
  const int64_t positions = chunk_extent(call.length, ranks, rank).size;
  if (k.size(2) != q.size(2) || v.size(2) != q.size(2) || q.size(2) != positions)
    throw DTensorError("context-parallel attention: this rank holds " + std::to_string(q.size(2)) + " query, " + std::to_string(k.size(2)) +
                       " key and " + std::to_string(v.size(2)) + " value positions, but its block of " + std::to_string(call.length) + " has " +
                       std::to_string(positions) + where + ": shard all three alike along the sequence");
  if (k.size(1) != v.size(1) || q.size(1) % k.size(1) != 0)
    throw DTensorError("context-parallel attention: " + std::to_string(q.size(1)) + " query heads over " + std::to_string(k.size(1)) +
                       " key and " + std::to_string(v.size(1)) + " value heads" + where + ": keys and values need the same heads, dividing the queries'");
}

namespace {

at::Tensor laid_out_as(const at::Tensor& t, at::Tensor target) {
  return t.strides() == target.strides() ? t : target.copy_(t);
}

}  // namespace

at::Tensor laid_out_like_queries(const at::Tensor& t, const at::Tensor& q) { return laid_out_as(t, at::empty_like(q, t.options())); }

at::Tensor empty_heads_last(at::IntArrayRef sizes, const at::TensorOptions& options) {
  std::vector<int64_t> order(sizes.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int64_t>(d);
  std::swap(order[1], order[2]);
  return at::empty_permuted(sizes, order, options);
}

at::Tensor laid_out_heads_last(const at::Tensor& t) { return laid_out_as(t, empty_heads_last(t.sizes(), t.options())); }

namespace {

std::string label(const ContextAttention& call) { return "context-parallel attention over " + call.mesh->dim_label(call.dim); }

}  // namespace

std::vector<SequenceRun> sequence_runs(const ContextAttention& call, int64_t rank) {
  return dtensor::sequence_runs(call.length, call.mesh->size(call.dim), rank, call.load_balanced, label(call));
}

std::vector<int64_t> sequence_order_of_blocks(const ContextAttention& call) {
  return dtensor::sequence_order_of_blocks(call.length, call.mesh->size(call.dim), call.load_balanced, label(call));
}

}  // namespace dtensor::detail
