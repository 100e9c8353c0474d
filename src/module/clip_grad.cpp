// Gradient clipping by the global norm across shards, with the fewest all-reduces: gradients that are
// sharded over the same mesh dims pool their local sums, and each pool meets the other ranks once.
// Sums stay tensors on the gradients' device until the end, so the whole clip reads one number back
// to the host (on CUDA, one stall instead of one per parameter).

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
  at::Tensor local;                   // 0-d double on the gradients' device; undefined: nothing yet
};

// Scales what each rank holds of every gradient; for a DTensor, its shard (no dispatch, no
// communication). A Partial gradient scales term by term.
void scale_gradients(const std::vector<at::Tensor>& parameters, const at::Tensor& coefficient) {
  for (const auto& p : parameters) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    at::Tensor held = is_dtensor(g) ? local_tensor_of(g) : g.detach();
    held.mul_(coefficient.to(held.device()));
  }
}

// `value` (0-d, or undefined for nothing held) as the 1-element tensor a scalar all-reduce on `mesh`
// takes, on the mesh's device: zero where undefined, the identity of the sum and of the maximum of
// absolute values (gradients offloaded to host memory from a CUDA mesh give host values).
at::Tensor reducible_on(const DeviceMesh& mesh, const at::Tensor& value) {
  const at::Device device(mesh.device_type());
  return value.defined() ? value.reshape({1}).to(device) : at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
}

// The sum of |g|^norm_type over every element of every gradient (their maximum |g| for the infinity
// norm), each element counted once however the gradients are sharded; undefined without gradients.
at::Tensor gradient_norm_power(const std::vector<at::Tensor>& parameters, double norm_type) {
  const bool infinity = std::isinf(norm_type);
  auto combine = [&](const at::Tensor& acc, const at::Tensor& term) {
    if (!acc.defined()) return term;
    const at::Tensor t = term.to(acc.device());
    return infinity ? at::maximum(acc, t) : acc + t;
  };
  auto accumulate = [&](const at::Tensor& acc, const at::Tensor& local) {
    if (local.numel() == 0) return acc;
    const at::Tensor a = local.detach().abs().to(at::kDouble);
    return combine(acc, infinity ? a.max() : a.pow(norm_type).sum());
  };
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());

  at::Tensor plain;  // plain gradients are whole on every rank
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
      if (placements[d].is_sharding()) sharded.push_back(d);
    auto it = std::find_if(pools.begin(), pools.end(),
                           [&](const Pool& p) { return p.mesh == mesh_of(g) && p.sharded_dims == sharded; });
    Pool& pool = it != pools.end() ? *it : pools.emplace_back(Pool{mesh_of(g), sharded});
    if (mesh_of(g)->contains_this_rank()) pool.local = accumulate(pool.local, local_tensor_of(g));
  }

  at::Tensor total = plain;
  for (Pool& pool : pools) {
    // Every member of a pool's mesh joins its all-reduces, holding a value or not.
    at::Tensor value = reducible_on(*pool.mesh, pool.local);
    if (pool.mesh->contains_this_rank())
      for (int64_t d : pool.sharded_dims) detail::all_reduce_(*pool.mesh, d, value, infinity ? ReduceOp::Max : ReduceOp::Sum);
    total = combine(total, value.reshape({}));
  }
  return total;
}

}  // namespace

double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  return clip_grad_norm_(parameters, max_norm, norm_type, nullptr, 0);
}

double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type, const MeshPtr& split_mesh,
                       int64_t split_dim) {
  const bool infinity = std::isinf(norm_type);
  at::Tensor total = gradient_norm_power(parameters, norm_type);
  if (split_mesh) {
    // This rank's part of the model meets the other parts: every rank of the dim joins, holding a
    // gradient or not.
    at::Tensor value = reducible_on(*split_mesh, total);
    detail::all_reduce_(*split_mesh, split_dim, value, infinity ? ReduceOp::Max : ReduceOp::Sum);
    total = value.reshape({});
  }
  if (!total.defined()) return 0;
  const at::Tensor norm = infinity ? total : total.pow(1.0 / norm_type);
  // min(1, max_norm / norm), applied on the device without reading it back.
  scale_gradients(parameters, (max_norm / (norm + 1e-6)).clamp_max(1.0));
  return norm.item<double>();  // the one host sync
}

}  // namespace dtensor
