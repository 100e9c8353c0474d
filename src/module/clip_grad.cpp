// Gradient clipping by the global norm across shards, with the fewest all-reduces: gradients that are
// sharded over the same mesh dims pool their local sums, and each pool meets the other ranks once.

#include <cmath>
#include <limits>
#include <algorithm>

#include "../mesh/collectives.h"
#include "dtensor/api.h"
#include "dtensor/optim.h"

namespace dtensor {
namespace {

// Sums (or maxima, for the infinity norm) of |g|^p over local shards that share one reduction.
struct Pool {
  MeshPtr mesh;
  std::vector<int64_t> sharded_dims;  // mesh dims over which the pool's gradients are split
  double local = 0;
};

}  // namespace

double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  const bool infinity = std::isinf(norm_type);
  auto accumulate = [&](double acc, const at::Tensor& local) {
    if (local.numel() == 0) return acc;
    const at::Tensor a = local.detach().abs().to(at::kDouble);
    return infinity ? std::max(acc, a.max().item<double>()) : acc + a.pow(norm_type).sum().item<double>();
  };
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());

  double plain = 0;  // plain gradients are whole on every rank
  // In order of first appearance, which every rank shares (parameters come in the same order), so the
  // all-reduces below run in the same order everywhere.
  std::vector<Pool> pools;
  for (at::Tensor& g : grads) {
    if (!is_dtensor(g)) {
      plain = accumulate(plain, g);
      continue;
    }
    Placements placements = placements_of(g);
    bool partial = false;
    for (auto& p : placements)
      if (p.is_partial()) {
        p = Replicate();
        partial = true;
      }
    if (partial) g = redistribute(g, placements);
    std::vector<int64_t> sharded;
    for (int64_t d = 0; d < static_cast<int64_t>(placements.size()); ++d)
      if (placements[d].is_shard()) sharded.push_back(d);
    auto it = std::find_if(pools.begin(), pools.end(),
                           [&](const Pool& p) { return p.mesh == mesh_of(g) && p.sharded_dims == sharded; });
    Pool& pool = it != pools.end() ? *it : pools.emplace_back(Pool{mesh_of(g), sharded});
    if (mesh_of(g)->contains_this_rank()) pool.local = accumulate(pool.local, local_tensor_of(g));
  }

  double total = plain;
  for (const Pool& pool : pools) {
    at::Tensor value = at::tensor({pool.local}, at::kDouble);
    if (pool.mesh->contains_this_rank())
      for (int64_t d : pool.sharded_dims) detail::all_reduce_(*pool.mesh, d, value, infinity ? ReduceOp::Max : ReduceOp::Sum);
    total = infinity ? std::max(total, value.item<double>()) : total + value.item<double>();
  }
  const double norm = infinity ? total : std::pow(total, 1.0 / norm_type);
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1)
    for (const auto& p : parameters) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      // Scale what each rank holds; for a DTensor, its shard (no dispatch, no communication). A Partial
      // gradient scales term by term.
      if (is_dtensor(g)) {
        at::Tensor local = local_tensor_of(g);
        local.mul_(coefficient);
      } else {
        g.detach().mul_(coefficient);
      }
    }
  return norm;
}

}  // namespace dtensor
