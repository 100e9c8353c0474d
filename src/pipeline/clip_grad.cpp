#include <ATen/ATen.h>

#include <cmath>

#include "../mesh/collectives.h"
#include "dtensor/errors.h"
#include "dtensor/pipeline.h"

namespace dtensor::pipeline {

double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, const MeshPtr& mesh, int64_t pp_dim) {
  at::Tensor sum = at::zeros({1}, at::kDouble);
  for (const at::Tensor& p : parameters) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (g.key_set().has(c10::DispatchKey::PrivateUse2))
      throw DTensorError("pipeline::clip_grad_norm_: a gradient is a DTensor (a stage under TP or FSDP); this clip takes plain gradients");
    sum += g.detach().to(at::kDouble).pow(2).sum();
  }
  detail::all_reduce_(*mesh, pp_dim, sum, ReduceOp::Sum);
  const double norm = std::sqrt(sum.item<double>());
  const double coefficient = std::min(1.0, max_norm / (norm + 1e-6));
  for (const at::Tensor& p : parameters)
    if (p.grad().defined()) p.grad().detach().mul_(coefficient);
  return norm;
}

}  // namespace dtensor::pipeline
