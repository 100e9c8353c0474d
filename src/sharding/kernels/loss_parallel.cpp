// Loss parallelism fused at the autograd level, as Megatron's vocabulary-parallel cross-entropy:
// cross_entropy over class-sharded logits [N, C] runs as one op whose forward all-reduces the row max,
// then the row sums of exponentials together with the target logits (2 all-reduces, Megatron needs 3),
// plus for a mean or sum over a sharded batch the total (and total weight), and whose backward is
// softmax minus one-hot on the local classes: no collective at all. The loss comes out Replicate, so
// reading it costs nothing either.
//
// Taken when the logits are a floating 2-d DTensor with the class dim sharded, every other mesh dim
// Replicate or sharding the batch; the target is rows laid out like the logits' (a DTensor, or a
// plain tensor under ImplicitReplicationGuard when the batch is whole); a class weight, if any, is
// replicated and needs no gradient; no label smoothing. Anything else decomposes as LibTorch does
// (log_softmax + nll_loss, with the rules of loss.cpp).

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <ATen/ops/cross_entropy_loss_native.h>
#include <torch/csrc/autograd/function.h>
#include <torch/library.h>

#include <limits>

#include "../../mesh/collectives.h"
#include "../../tensor/autograd_nodes.h"
#include "../../redistribute/executor.h"
#include "dtensor/api.h"
#include "dtensor/comm_debug.h"
#include "dtensor/errors.h"
#include "dtensor/sharding.h"
#include "../rules/index_window.h"

namespace dtensor::rules {
namespace {

constexpr const char* kCrossEntropyOp = "aten::cross_entropy_loss";

struct FusedLayout {
  std::vector<int64_t> class_dims;  // mesh dims sharding the classes (dim 1)
  std::vector<int64_t> batch_dims;  // mesh dims sharding the rows (dim 0)
};

// A tensor indexed by row or replicated: a DTensor on `mesh` with `expected` placements, or a plain
// tensor standing for a replicated one (ImplicitReplicationGuard) when `expected` is all Replicate.
bool laid_out_as(const at::Tensor& t, const MeshPtr& mesh, const Placements& expected) {
  if (!is_dtensor(t)) {
    const bool whole = std::all_of(expected.begin(), expected.end(), [](const Placement& p) { return p.is_replicate(); });
    return whole && ImplicitReplicationGuard::active();
  }
  return same_mesh(mesh_of(t), mesh) && placements_of(t) == expected;
}

std::optional<FusedLayout> fused_layout(const at::Tensor& self, const at::Tensor& target,
                                        const std::optional<at::Tensor>& weight, double label_smoothing) {
  if (!is_dtensor(self) || self.dim() != 2 || target.dim() != 1 || label_smoothing != 0.0 ||
      !at::isFloatingType(self.scalar_type()) || target.scalar_type() != at::kLong)
    return std::nullopt;
  const DTensorSpec& spec = spec_of(self);
  FusedLayout layout;
  Placements rows, replicated(spec.placements.size(), Replicate());
  for (size_t m = 0; m < spec.placements.size(); ++m) {
    const Placement& p = spec.placements[m];
    if (p.is_shard() && p.dim() == 1) layout.class_dims.push_back(static_cast<int64_t>(m));
    else if (p.is_shard() && p.dim() == 0) layout.batch_dims.push_back(static_cast<int64_t>(m));
    else if (!p.is_replicate()) return std::nullopt;
    rows.push_back(p.is_shard() && p.dim() == 0 ? Shard(0) : Replicate());
  }
  if (layout.class_dims.empty() || !laid_out_as(target, spec.mesh, rows)) return std::nullopt;
  if (weight && weight->defined() && (weight->requires_grad() || !laid_out_as(*weight, spec.mesh, replicated)))
    return std::nullopt;
  return layout;
}

at::Tensor local_of(const at::Tensor& t) { return is_dtensor(t) ? local_tensor_of(t) : t; }

// LibTorch refuses a target outside [0, C) that is not ignore_index; masked to another rank's
// classes, it would give a quiet wrong loss instead.
void check_targets(const at::Tensor& target, int64_t classes, int64_t ignore_index) {
  if (const std::optional<int64_t> outside = first_index_outside(target, classes, ignore_index))
    throw DTensorError(std::string(kCrossEntropyOp) + ": target " + std::to_string(*outside) + " is out of bounds for " +
                       std::to_string(classes) + " classes (and not ignore_index " + std::to_string(ignore_index) + ")");
}

// What backward needs, on this rank: p = exp(logits - max) / sum, minus one-hot, times each row's
// coefficient (its weight, over the total weight for a mean) and the incoming gradient.
struct LossParallelCrossEntropyBackward : torch::autograd::Node {
  DTensorSpec logits_spec;
  Placements grad_placements;  // what the loss's gradient must be laid out as
  int64_t reduction = at::Reduction::Mean;
  at::Tensor logits, row_max, row_sum;  // local, in the compute dtype
  at::Tensor target_column, in_range;   // the target's local class index, and whether this rank holds it
  at::Tensor coefficient;               // per local row

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    std::lock_guard<std::mutex> lock(mutex_);  // as LibTorch's nodes: release_variables may run concurrently
    const CommContext context(kCrossEntropyOp);
    const auto& grad = dtensor_impl(grads[0], "the gradient flowing back into cross_entropy");
    at::Tensor g = detail::redistribute_local(grad.local(), grad.spec(), grad_placements);
    DTensorSpec spec = logits_spec;
    if (!spec.mesh->contains_this_rank()) {  // holds no shard (and saved nothing)
      const auto options = at::TensorOptions().dtype(spec.meta.dtype).device(spec.mesh->device_type());
      return {make_dtensor(at::empty({0}, options), std::move(spec))};
    }
    g = g.to(logits.scalar_type());
    const at::Tensor scale = coefficient * (reduction == at::Reduction::None ? g : g.expand_as(coefficient));
    at::Tensor local = (logits - row_max.unsqueeze(1)).exp_().div_(row_sum.unsqueeze(1)).mul_(scale.unsqueeze(1));
    if (local.size(1) > 0)
      local.scatter_add_(1, target_column.unsqueeze(1), (-scale * in_range).unsqueeze(1));
    local = local.to(logits_spec.meta.dtype);
    return {make_dtensor(in_global_layout(local, spec.meta), std::move(spec))};
  }
  std::string name() const override { return "dtensor::LossParallelCrossEntropyBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    logits = row_max = row_sum = target_column = in_range = coefficient = at::Tensor();
  }
};

at::Tensor fused_cross_entropy(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                               int64_t reduction, int64_t ignore_index, const FusedLayout& layout) {
  const CommContext context(kCrossEntropyOp);
  const DTensorSpec& spec = spec_of(self);
  const DeviceMesh& mesh = *spec.mesh;
  const int64_t rows = self.size(0), classes = self.size(1);
  // The loss: per row (batch shards kept) or one number, Replicate elsewhere.
  Placements out_placements(spec.placements.size(), Replicate());
  if (reduction == at::Reduction::None)
    for (int64_t m : layout.batch_dims) out_placements[static_cast<size_t>(m)] = Shard(0);
  const Shape out_shape = reduction == at::Reduction::None ? Shape{rows} : Shape{};
  DTensorSpec out_spec{spec.mesh, out_placements, TensorMeta{out_shape, contiguous_strides(out_shape), self.scalar_type()}};

  auto node = dtensor::detail::make_node<LossParallelCrossEntropyBackward>();
  node->logits_spec = spec;
  node->grad_placements = out_placements;
  node->reduction = reduction;
  at::Tensor out_local;
  if (!mesh.contains_this_rank()) {
    out_local = at::empty({0}, self.options());
  } else {
    at::NoGradGuard no_grad;
    const bool reduced_precision = self.scalar_type() == at::kHalf || self.scalar_type() == at::kBFloat16;
    const at::Tensor logits = reduced_precision ? local_of(self).to(at::kFloat) : local_of(self);
    const at::Tensor t = local_of(target);
    const int64_t offset = local_layout(spec.meta.shape, mesh.shape(), *mesh.coordinate(), spec.placements).offset[1];
    const int64_t local_classes = logits.size(1);
    check_targets(t, classes, ignore_index);
    const at::Tensor valid = t.ne(ignore_index);
    // The row max over all classes (a rank without classes offers -inf).
    at::Tensor row_max = local_classes > 0 ? logits.amax(1)
                                           : at::full({logits.size(0)}, -std::numeric_limits<double>::infinity(), logits.options());
    detail::all_reduce_over(mesh, layout.class_dims, row_max, ReduceOp::Max);
    // The sums of exponentials and the target logits, in one all-reduce. A row whose target another
    // rank holds offers 0 (selected, not multiplied: its column-0 logit may be -inf).
    const IndexWindow target_window = index_window(t, offset, local_classes, /*elsewhere=*/0, /*dropped=*/ignore_index);
    const at::Tensor &in_range = target_window.held, &column = target_window.local_index;
    at::Tensor sums = local_classes > 0
                          ? at::stack({(logits - row_max.unsqueeze(1)).exp().sum(1),
                                       at::where(in_range, logits.gather(1, column.unsqueeze(1)).squeeze(1), 0)})
                          : at::zeros({2, logits.size(0)}, logits.options());
    detail::all_reduce_over(mesh, layout.class_dims, sums, ReduceOp::Sum);
    at::Tensor row_sum = sums[0];
    const at::Tensor picked = sums[1];
    // -log p(target) = log(sum) + max - target logit, for rows that count; their weight.
    at::Tensor row_weight = valid.to(logits.scalar_type());
    if (weight && weight->defined())
      row_weight = row_weight.mul(local_of(*weight).to(logits.scalar_type()).index_select(0, t.clamp(0, classes - 1)));
    const at::Tensor row_loss = (row_sum.log() + row_max - picked).mul_(row_weight);
    at::Tensor coefficient = row_weight;
    if (reduction == at::Reduction::None) {
      out_local = row_loss;
    } else {
      at::Tensor totals = at::stack({row_loss.sum(), row_weight.sum()});
      if (!layout.batch_dims.empty()) detail::all_reduce_over(mesh, layout.batch_dims, totals, ReduceOp::Sum);
      out_local = reduction == at::Reduction::Mean ? totals[0] / totals[1] : totals[0];
      if (reduction == at::Reduction::Mean) coefficient = row_weight / totals[1];
    }
    out_local = out_local.to(self.scalar_type());
    node->logits = logits;
    node->row_max = row_max;
    node->row_sum = row_sum;
    node->target_column = column;
    node->in_range = in_range.to(logits.scalar_type());
    node->coefficient = coefficient;
  }
  at::Tensor out = make_dtensor(in_global_layout(out_local, out_spec.meta), std::move(out_spec));
  detail::record(node, self, out);
  return out;
}

at::Tensor cross_entropy_loss(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                              int64_t reduction, c10::SymInt ignore_index, double label_smoothing) {
  if (const auto layout = fused_layout(self, target, weight, label_smoothing))
    return fused_cross_entropy(self, target, weight, reduction, ignore_index.expect_int(), *layout);
  return at::native::cross_entropy_loss_symint(self, target, weight, reduction, std::move(ignore_index), label_smoothing);
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse2, m) { m.impl("cross_entropy_loss", TORCH_FN(cross_entropy_loss)); }

}  // namespace
}  // namespace dtensor::rules
