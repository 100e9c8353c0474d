// The experts of a mixture of experts on one rank: token rows permuted by expert, sent to their
// experts' ranks (expert parallelism), run through the local experts as one grouped matrix multiply,
// sent back, and summed per token with their routing weights. The MoE layer (src/module/moe.cpp) and
// graph programs' dtensor::moe_experts (rules/experts.cpp) run it.

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "../../mesh/collectives.h"
#include "dtensor/all_to_all.h"
#include "dtensor/device_mesh.h"
#include "dtensor/errors.h"
#include "grouped_experts.h"

namespace dtensor::detail {
namespace {

std::vector<int64_t> as_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// An expert index the router must not give (outside [0, experts], `experts` marking a drop), if any.
std::optional<int64_t> out_of_range(const at::Tensor& experts, int64_t num_experts) {
  if (experts.numel() == 0) return std::nullopt;
  const at::Tensor bounds = at::stack({experts.min(), experts.max()}).to(at::kCPU);  // one host read
  const int64_t low = bounds[0].item<int64_t>(), high = bounds[1].item<int64_t>();
  if (low < 0) return low;
  if (high > num_experts) return high;
  return std::nullopt;
}

[[noreturn]] void refuse_routing(int64_t chosen, int64_t num_experts, const std::string& path, const std::string& where) {
  throw DTensorError("MoE layer '" + path + "'" + where + ": the router chose expert " + std::to_string(chosen) + ", outside [0, " +
                     std::to_string(num_experts) + "); a router must return indices of the layer's experts (or " +
                     std::to_string(num_experts) + " for a dropped assignment)");
}

// x [rows, in] times each expert's w [in -> out] ([experts, out, in], transformers' layout) on its
// block of rows (counts[e] rows each, in expert order). One grouped matrix multiply where LibTorch
// has one for this dtype and layout (float and 16-bit types with 16-byte aligned rows), else one
// matrix multiply per expert.
at::Tensor grouped_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) {
  const auto element = static_cast<int64_t>(x.element_size());
  const bool grouped_kernel = (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) &&
                              (x.size(1) * element) % 16 == 0 && (w.size(1) * element) % 16 == 0;
  if (grouped_kernel) {
    const at::Tensor offsets = counts.cumsum(0).to(at::kInt);
    return at::_grouped_mm(x.contiguous(), w.transpose(-2, -1), offsets);
  }
  std::vector<at::Tensor> blocks;
  int64_t at_row = 0;
  const std::vector<int64_t> rows = as_vector(counts);
  for (size_t e = 0; e < rows.size(); ++e) {
    blocks.push_back(at::matmul(x.narrow(0, at_row, rows[e]), w[static_cast<int64_t>(e)].t()));
    at_row += rows[e];
  }
  return blocks.empty() ? at::empty({0, w.size(1)}, x.options()) : at::cat(blocks);
}

// The SwiGLU MLPs of the experts on their rows (blocks of `counts` rows in expert order).
at::Tensor expert_mlps(const at::Tensor& rows, const at::Tensor& gate_up, const at::Tensor& down, const at::Tensor& counts) {
  const at::Tensor both = grouped_linear(rows, gate_up, counts);
  const auto halves = both.chunk(2, -1);
  return grouped_linear(at::silu(halves[0]) * halves[1], down, counts);
}

// Rows received from every member, in (member, local expert) blocks, reordered into (local expert,
// member) blocks: the order `received` [members, local experts] of counts gives the positions of.
at::Tensor expert_major_order(const at::Tensor& received) {
  const at::Tensor starts = (received.reshape(-1).cumsum(0) - received.reshape(-1)).reshape(received.sizes());
  std::vector<at::Tensor> pieces;
  const std::vector<int64_t> count = as_vector(received), start = as_vector(starts);
  const int64_t members = received.size(0), local = received.size(1);
  for (int64_t e = 0; e < local; ++e)
    for (int64_t m = 0; m < members; ++m) {
      const auto i = static_cast<size_t>(m * local + e);
      pieces.push_back(at::arange(start[i], start[i] + count[i], at::kLong));
    }
  return (pieces.empty() ? at::empty({0}, at::kLong) : at::cat(pieces)).to(received.device());
}

// What each member of the ep dim sends this one, per local expert: one small all-to-all of the counts
// [members, local experts], each row followed by this rank's routing verdict (bad, the index) so that
// a router gone wrong on one rank stops every rank here with the same error, instead of leaving its
// peers waiting in the exchange that follows.
at::Tensor exchanged_counts(const at::Tensor& counts, std::optional<int64_t> bad, int64_t local, int64_t num_experts,
                            const ExpertsSpread& spread, const std::string& path) {
  const MeshPtr& mesh = spread.mesh;
  const int64_t members = mesh->size(spread.dim);
  const at::Tensor verdict = at::tensor({bad ? int64_t{1} : 0, bad.value_or(0)}, at::kLong).to(counts.device()).expand({members, 2});
  const at::Tensor sent = at::cat({counts.reshape({members, local}), verdict}, 1).contiguous();
  const at::Tensor received = detail::all_to_all(*mesh, spread.dim, sent.reshape(-1), std::vector<int64_t>(members, local + 2),
                                                 std::vector<int64_t>(members, local + 2))
                                  .reshape({members, local + 2});
  const std::vector<int64_t> flags = as_vector(received.select(1, local)), values = as_vector(received.select(1, local + 1));
  for (int64_t m = 0; m < members; ++m) {
    if (!flags[static_cast<size_t>(m)]) continue;
    Shape at = *mesh->coordinate();
    at[static_cast<size_t>(spread.dim)] = m;
    refuse_routing(values[static_cast<size_t>(m)], num_experts, path,
                   " (experts spread over mesh dim " + std::to_string(spread.dim) + "; on rank " +
                       std::to_string(mesh->global_rank_at(at)) + ")");
  }
  return received.narrow(1, 0, local);
}

// The expert outputs for `rows` (sorted by expert, `counts` per global expert): run here, or sent to
// the experts' ranks and back.
at::Tensor dispatched_mlps(const at::Tensor& rows, const at::Tensor& counts, std::optional<int64_t> bad, const at::Tensor& gate_up,
                           const at::Tensor& down, int64_t num_experts, const ExpertsSpread& spread,
                           const std::string& path) {
  if (!spread.mesh) return expert_mlps(rows, gate_up, down, counts);
  const MeshPtr& mesh = spread.mesh;
  const at::Tensor received = exchanged_counts(counts, bad, gate_up.size(0), num_experts, spread, path);
  const at::Tensor per_member = counts.reshape({received.size(0), received.size(1)});
  const std::vector<int64_t> send = as_vector(per_member.sum(1)), receive = as_vector(received.sum(1));
  const at::Tensor arrived = all_to_all_single(rows, receive, send, mesh, spread.dim);
  const at::Tensor order = expert_major_order(received);
  const at::Tensor outputs = expert_mlps(arrived.index_select(0, order), gate_up, down, received.sum(0));
  const at::Tensor back_in_arrival_order = outputs.index_select(0, at::argsort(order));
  return all_to_all_single(back_in_arrival_order, send, receive, mesh, spread.dim);
}

}  // namespace

void check_routing(const at::Tensor& experts, int64_t num_experts, const std::string& path) {
  if (const std::optional<int64_t> bad = out_of_range(experts, num_experts)) refuse_routing(*bad, num_experts, path, "");
}

at::Tensor run_experts(const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights,
                       const at::Tensor& gate_up, const at::Tensor& down, int64_t num_experts,
                       const ExpertsSpread& spread, const std::string& path) {
  if (experts.dim() != 2 || experts.size(0) != hidden.size(0) || !weights.sizes().equals(experts.sizes()) || hidden.dim() != 2)
    throw DTensorError("MoE layer '" + path + "': the experts take hidden states [tokens, hidden] with their routing [tokens, k] "
                       "(chosen experts and their weights); got hidden " + c10::str(hidden.sizes()) + ", experts " +
                       c10::str(experts.sizes()) + ", weights " + c10::str(weights.sizes()));
  const std::optional<int64_t> bad = out_of_range(experts, num_experts);
  if (bad && !spread.mesh) refuse_routing(*bad, num_experts, path, "");
  if (!spread.mesh && gate_up.size(0) == 0) return at::zeros_like(hidden);  // a rank holding none of unevenly spread experts
  const int64_t k = experts.size(1);
  // A bad routing under expert parallelism still takes part in the counts' exchange, sending nothing.
  const at::Tensor flat_experts = bad ? at::full({experts.numel()}, num_experts, experts.options()) : experts.reshape(-1);
  const at::Tensor kept = flat_experts.lt(num_experts).nonzero().squeeze(1);  // dropped ones go nowhere
  const at::Tensor kept_experts = flat_experts.index_select(0, kept);
  const at::Tensor order = kept.index_select(0, at::argsort(kept_experts, /*stable=*/true));  // by expert
  const at::Tensor tokens = at::div(order, k, "floor");
  const at::Tensor counts = at::bincount(kept_experts, {}, num_experts);
  const at::Tensor outputs = dispatched_mlps(hidden.index_select(0, tokens), counts, bad, gate_up, down, num_experts, spread, path);
  const at::Tensor weighted = outputs * weights.reshape(-1).index_select(0, order).unsqueeze(1);
  return at::zeros_like(hidden).index_add(0, tokens, weighted.to(hidden.scalar_type()));
}

}  // namespace dtensor::detail
