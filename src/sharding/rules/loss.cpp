// Losses: nll_loss (nll_loss_forward / nll_loss2d_forward and their backward ops), mse_loss, and the
// log_softmax that cross_entropy (CompositeImplicit: _log_softmax + nll_loss_forward) decomposes into.
//
// Sample-sharded losses (batch, and the spatial dims of nll_loss2d) reduce to Partial(sum) pieces
// that divide by the GLOBAL count or total weight, so a mean over uneven shards is exact.
//
// Loss parallelism: cross_entropy also runs on class-sharded logits without gathering them. The common
// case is fused at the autograd level (kernels/loss_parallel.cpp: 2 all-reduces, none backward); the rules
// here serve the rest (label smoothing, a weight that needs a gradient, other layouts).
// log_softmax over the sharded class dim all-reduces the row max and the row sum of exponentials
// (small tensors, one value per row); nll_loss has each rank pick the target logits that fall in its
// class range (the others give 0), so the losses add up (Partial(sum)); backward is softmax minus
// one-hot on the local classes, with one more all-reduce of a row sum. No mode (PyTorch's
// loss_parallel()) is needed: these strategies move nothing, so propagation picks them whenever the
// logits arrive class-sharded, and they never communicate more than gathering the logits would.

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/stack.h>

#include <limits>

#include "../../mesh/collectives.h"
#include "../registry.h"
#include "dtensor/errors.h"
#include "form_helpers.h"
#include "index_window.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

bool any_shard(const std::vector<Placements>& inputs) {
  for (const auto& placements : inputs)
    for (const auto& p : placements)
      if (p.is_shard()) return true;
  return false;
}

// The input placements for output dim d of `shape` sharded, as elementwise ops broadcast (aligned
// from the right): an input shards its matching dim, or it is broadcast along d and Replicate.
Placements aligned_inputs(const OpSchema& s, const Shape& shape, int64_t d) {
  Placements out;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const Shape& in = s.input(i).meta.shape;
    const int64_t id = d - (static_cast<int64_t>(shape.size()) - static_cast<int64_t>(in.size()));
    out.push_back(id >= 0 && in[id] == shape[d] ? Shard(id) : Replicate());
  }
  return out;
}

// ---- log_softmax: _log_softmax(self, dim, half_to_float), _log_softmax_backward_data(grad_output,
// output, dim, input_dtype). Any dim may be sharded; the softmax dim needs the local kernels below.

// Sharding the softmax dim (argument `dim_arg`) costs the kernel `all_reduces` all-reduces of one
// value per row.
std::vector<DimStrategy> log_softmax_with(const OpSchema& s, size_t dim_arg, int all_reduces) {
  const int64_t dim = wrap_dim(s.args[dim_arg].toInt(), s.input_ndim(0));
  const Shape& shape = s.input(0).meta.shape;
  const int64_t rows = shape.empty() || shape[dim] == 0 ? 0 : numel(shape) / shape[dim];
  const double row_stats = static_cast<double>(rows * static_cast<int64_t>(c10::elementSize(s.input(0).meta.dtype)));
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < s.input_ndim(0); ++d) {
    const double cost = d == dim ? all_reduces * (kCollectiveLatencyBytes + row_stats) : 0;
    out.push_back({{Shard(d)}, Placements(s.inputs.size(), Shard(d)), cost});
  }
  return out;
}

// Forward: the row max and the row sum of exponentials.
std::vector<DimStrategy> log_softmax(const OpSchema& s) { return log_softmax_with(s, 1, 2); }

std::vector<DimStrategy> log_softmax_backward(const OpSchema& s) {
  std::vector<DimStrategy> out = log_softmax_with(s, 2, 1);  // the row sum of the gradient
  // grad_input = grad - exp(output) * sum(grad) is linear in grad.
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{Partial(op)}, {Partial(op), Replicate()}});
  return out;
}

// The max along `dim` (kept), -inf for an empty shard.
at::Tensor row_max(const at::Tensor& x, int64_t dim) {
  if (x.size(dim) > 0) return x.amax(dim, /*keepdim=*/true);
  std::vector<int64_t> shape = x.sizes().vec();
  shape[dim] = 1;
  return at::full(shape, -std::numeric_limits<double>::infinity(), x.options());
}

// log_softmax over a sharded dim: x - max - log(sum(exp(x - max))) with max and sum all-reduced,
// computed in the output's dtype (half_to_float asks for a float result).
LocalKernel sharded_log_softmax(const OpSchema& s, const PlacementStrategy& chosen) {
  const int64_t dim = wrap_dim(s.args[1].toInt(), s.input_ndim(0));
  const auto split = mesh_dims_sharding(chosen.inputs[0], dim);
  if (split.empty()) return {};
  return [mesh = s.mesh, split, dim, dtype = s.outputs[0].dtype](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const at::Tensor x = torch::jit::pop(stack, op.schema().arguments().size())[0].toTensor().to(dtype);
    at::Tensor max = row_max(x, dim);
    detail::all_reduce_over(*mesh, split, max, ReduceOp::Max);
    const at::Tensor shifted = x - max;
    at::Tensor sum_exp = shifted.exp().sum(dim, /*keepdim=*/true);
    detail::all_reduce_over(*mesh, split, sum_exp, ReduceOp::Sum);
    torch::jit::push(stack, shifted - sum_exp.log());
  };
}

// sharded_log_softmax as graph ops.
GraphForm sharded_log_softmax_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const int64_t dim = wrap_dim(s.args[1].toInt(), s.input_ndim(0));
  const auto split = mesh_dims_sharding(chosen.inputs[0], dim);
  Shape row_shape = local_part(s, s.input(0).meta.shape, chosen.inputs[0]).shape;
  const bool empty_shard = row_shape[dim] == 0;
  row_shape[dim] = 1;
  const at::ScalarType dtype = s.outputs[0].dtype;
  const bool cast = s.input(0).meta.dtype != dtype;
  return [=](GraphFormBuilder& b) -> std::vector<FormValue> {
    FormValue x = b.input(0);
    if (cast) x = b.op("aten::_to_copy", {x, c10::IValue(dtype)}, "in_output_dtype");
    const FormValue local_max = empty_shard ? b.op("aten::new_full", {x, row_shape, -std::numeric_limits<double>::infinity()}, "no_max")
                                            : b.op("aten::amax", {x, std::vector<int64_t>{dim}, true}, "local_max");
    const FormValue shifted = b.op("aten::sub.Tensor", {x, all_reduce_form(b, local_max, split, ReduceOp::Max)}, "shifted");
    const FormValue sum_exp = b.op("aten::sum.dim_IntList", {b.op("aten::exp", {shifted}, "exp"), std::vector<int64_t>{dim}, true}, "sum_exp");
    return {b.op("aten::sub.Tensor", {shifted, b.op("aten::log", {all_reduce_form(b, sum_exp, split, ReduceOp::Sum)}, "log_sum_exp")},
                 "log_softmax")};
  };
}

// Its gradient over a sharded dim: grad - exp(output) * sum(grad) with the sum all-reduced.
LocalKernel sharded_log_softmax_backward(const OpSchema& s, const PlacementStrategy& chosen) {
  const int64_t dim = wrap_dim(s.args[2].toInt(), s.input_ndim(0));
  const auto split = mesh_dims_sharding(chosen.inputs[0], dim);
  if (split.empty()) return {};
  return [mesh = s.mesh, split, dim, dtype = s.outputs[0].dtype](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const at::Tensor &grad = args[0].toTensor(), &output = args[1].toTensor();
    at::Tensor sum = grad.sum(dim, /*keepdim=*/true);
    detail::all_reduce_over(*mesh, split, sum, ReduceOp::Sum);
    torch::jit::push(stack, (grad - output.exp() * sum).to(dtype));
  };
}

// sharded_log_softmax_backward as graph ops.
GraphForm sharded_log_softmax_backward_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const int64_t dim = wrap_dim(s.args[2].toInt(), s.input_ndim(0));
  const auto split = mesh_dims_sharding(chosen.inputs[0], dim);
  const at::ScalarType dtype = s.outputs[0].dtype;
  const bool cast = s.input(0).meta.dtype != dtype;
  return [=](GraphFormBuilder& b) -> std::vector<FormValue> {
    const FormValue grad = b.input(0), output = b.input(1);
    const FormValue sum = all_reduce_form(b, b.op("aten::sum.dim_IntList", {grad, std::vector<int64_t>{dim}, true}, "grad_sum"), split,
                                          ReduceOp::Sum);
    FormValue out = b.op("aten::sub.Tensor", {grad, b.op("aten::mul.Tensor", {b.op("aten::exp", {output}, "softmax"), sum}, "scaled")},
                         "grad_input");
    if (cast) out = b.op("aten::_to_copy", {out, c10::IValue(dtype)}, "in_output_dtype");
    return {out};
  };
}

// ---- nll_loss: nll_loss[2d]_forward(self, target, weight?, reduction, ignore_index) -> (output,
// total_weight) and nll_loss[2d]_backward(grad_output, self, target, weight?, reduction, ignore_index,
// total_weight). self is [C], [N, C] or [N, C, H, W]; target has self's dims without the class dim.
// weight (one per class, small) is always Replicate.

struct Nll {
  int64_t ndim;       // of self
  int64_t class_dim;  // 1, or 0 for a single unbatched sample
  bool has_weight;
  int64_t reduction;
  int64_t ignore_index;

  // The target dim of self's (sample) dim d.
  int64_t target_dim(int64_t d) const { return d < class_dim ? d : d - 1; }
  // reduction=none over samples gives one loss per target element; otherwise the loss is a scalar
  // and total_weight is that of the counted targets (it is 0 for the former).
  bool per_element() const { return reduction == at::Reduction::None && ndim >= 2; }
};

// `self_arg`: where self is among the arguments (0 for forward, 1 for backward).
Nll nll_of(const OpSchema& s, size_t self_arg) {
  const int64_t ndim = s.input_ndim(*s.input_at_arg(self_arg));
  return Nll{ndim, ndim >= 2 ? 1 : 0, s.input_at_arg(self_arg + 2).has_value(), s.args[self_arg + 3].toInt(),
             s.args[self_arg + 4].toInt()};
}

std::vector<DimStrategy> nll_forward(const OpSchema& s) {
  const Nll n = nll_of(s, 0);
  auto inputs = [&](Placement self, Placement target) {
    Placements in{self, target};
    if (n.has_weight) in.push_back(Replicate());
    return in;
  };
  // total_weight is Replicate throughout: the local kernel all-reduces it over sample shards.
  std::vector<DimStrategy> out = {all_replicate(s), {{Partial(), Replicate()}, inputs(Shard(n.class_dim), Replicate())}};
  for (int64_t d = 0; d < n.ndim; ++d) {
    if (d == n.class_dim) continue;
    const int64_t t = n.target_dim(d);
    out.push_back({{n.per_element() ? Shard(t) : Partial(), Replicate()}, inputs(Shard(d), Shard(t))});
  }
  // The loss is linear in self (total_weight depends on target and weight only).
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg})
    out.push_back({{Partial(op), Replicate()}, inputs(Partial(op), Replicate())});
  return out;
}

std::vector<DimStrategy> nll_backward(const OpSchema& s) {
  const Nll n = nll_of(s, 1);
  auto inputs = [&](Placement grad, Placement self, Placement target) {
    Placements in{grad, self, target};
    if (n.has_weight) in.push_back(Replicate());
    in.push_back(Replicate());  // total_weight
    return in;
  };
  std::vector<DimStrategy> out = {all_replicate(s),
                                  {{Shard(n.class_dim)}, inputs(Replicate(), Shard(n.class_dim), Replicate())}};
  for (int64_t d = 0; d < n.ndim; ++d) {
    if (d == n.class_dim) continue;
    const int64_t t = n.target_dim(d);
    out.push_back({{Shard(d)}, inputs(n.per_element() ? Shard(t) : Replicate(), Shard(d), Shard(t))});
  }
  // The gradient is linear in grad_output.
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg})
    out.push_back({{Partial(op)}, inputs(Partial(op), Replicate(), Replicate())});
  return out;
}

// Classes [offset, offset + size) of `total`, the part of self's class dim this rank holds.
struct ClassRange {
  int64_t offset;
  int64_t size;
  int64_t total;
};

ClassRange class_range(const OpSchema& s, const Nll& n, size_t self_input, const Placements& placements) {
  const Shape& shape = s.input(self_input).meta.shape;
  const LocalLayout part = local_part(s, shape, placements);
  return {part.offset[n.class_dim], part.shape[n.class_dim], shape[n.class_dim]};
}

// This rank's view of the call: targets as positions in its class range, with ignored targets and
// those of other ranks' classes set to -1 (passed as the ignore index), and its slice of weight.
constexpr int64_t kNotHere = -1;

struct LocalTargets {
  at::Tensor target;
  c10::IValue weight;  // None when the call has none
};

LocalTargets local_targets(const at::Tensor& target, const at::Tensor& weight, int64_t ignore_index, ClassRange r) {
  const at::Tensor here = (target != ignore_index) & (target >= r.offset) & (target < r.offset + r.size);
  return {at::where(here, target - r.offset, kNotHere),
          weight.defined() ? c10::IValue(weight.narrow(0, r.offset, r.size)) : c10::IValue()};
}

// The total weight of the counted (not ignored) targets and the number of targets outside
// [0, classes), together so that one all-reduce sums both over sample shards.
at::Tensor target_stats(const at::Tensor& target, const at::Tensor& weight, int64_t ignore_index, int64_t classes,
                        at::ScalarType dtype) {
  const at::Tensor counted = target != ignore_index;
  const at::Tensor in_bounds = (target >= 0) & (target < classes);
  const at::Tensor picked = counted & in_bounds;
  const at::Tensor total = weight.defined() ? at::where(picked, weight.take(at::where(picked, target, 0)), 0).sum()
                                            : picked.sum().to(dtype);
  return at::stack({total, (counted & in_bounds.logical_not()).sum().to(dtype)});
}

// target_stats as graph ops.
FormValue target_stats_form(GraphFormBuilder& b, FormValue target, std::optional<FormValue> weight, int64_t ignore_index,
                            int64_t classes, at::ScalarType dtype) {
  const FormValue counted = b.op("aten::ne.Scalar", {target, ignore_index}, "counted");
  const FormValue in_bounds = b.op("aten::logical_and", {b.op("aten::ge.Scalar", {target, int64_t{0}}, "from_0"),
                                                         b.op("aten::lt.Scalar", {target, classes}, "below_classes")},
                                   "in_bounds");
  const FormValue picked = b.op("aten::logical_and", {counted, in_bounds}, "picked");
  FormValue total;
  if (weight) {
    const FormValue picked_target = b.op("aten::where.ScalarOther", {picked, target, int64_t{0}}, "picked_target");
    const FormValue weights = b.op("aten::take", {*weight, picked_target}, "target_weights");
    total = b.op("aten::sum", {b.op("aten::where.ScalarOther", {picked, weights, int64_t{0}}, "picked_weights")}, "total_weight");
  } else {
    total = b.op("aten::sum", {picked, c10::IValue(dtype)}, "total_weight");
  }
  const FormValue outside = b.op("aten::logical_and", {counted, b.op("aten::logical_not", {in_bounds}, "out_of_bounds")}, "outside");
  return b.op("aten::stack", {std::vector<FormValue>{total, b.op("aten::sum", {outside, c10::IValue(dtype)}, "outside_count")}},
              "target_stats");
}

// local_targets as graph ops: the targets in this rank's class range, and its slice of weight.
struct LocalTargetsForm {
  FormValue target;
  FormArg weight;
};
LocalTargetsForm local_targets_form(GraphFormBuilder& b, FormValue target, std::optional<FormValue> weight, int64_t ignore_index,
                                    ClassRange r) {
  const FormIndexWindow here = index_window_form(b, target, r.offset, r.size, kNotHere, ignore_index);
  if (!weight) return {here.local_index, c10::IValue()};
  return {here.local_index, b.op("aten::slice.Tensor", {*weight, int64_t{0}, r.offset, r.offset + r.size}, "local_weight")};
}

// Runs the op itself on local arguments; returns its outputs.
std::vector<c10::IValue> call_local(const c10::OperatorHandle& op, std::vector<c10::IValue> args) {
  torch::jit::Stack stack(std::move(args));
  op.callBoxed(stack);
  return stack;
}

// The mesh dims sharding a sample dim of self.
std::vector<int64_t> sample_mesh_dims(const Nll& n, const Placements& self) {
  std::vector<int64_t> out;
  for (int64_t m = 0; m < static_cast<int64_t>(self.size()); ++m)
    if (self[m].is_shard() && self[m].dim() != n.class_dim) out.push_back(m);
  return out;
}

std::string target_outside_message(const OpSchema& s, const Nll& n, const ClassRange& classes) {
  return s.schema.name() + ": a target lies outside [0, " + std::to_string(classes.total) + ") and is not ignore_index " +
         std::to_string(n.ignore_index);
}

// Forward on sharded self: the local op (a sum where the loss is a mean) on this rank's classes and
// samples, divided by the global total weight, which is also what total_weight returns.
LocalKernel nll_forward_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  if (!any_shard(chosen.inputs)) return {};
  const Nll n = nll_of(s, 0);
  const ClassRange classes = class_range(s, n, 0, chosen.inputs[0]);
  const std::vector<int64_t> sample_split = sample_mesh_dims(n, chosen.inputs[0]);
  return [n, classes, sample_split, mesh = s.mesh, message = target_outside_message(s, n, classes)](const c10::OperatorHandle& op,
                                                                                                     torch::jit::Stack& stack) {
    auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const at::Tensor self = args[0].toTensor(), target = args[1].toTensor();
    const at::Tensor weight = args[2].isNone() ? at::Tensor() : args[2].toTensor();
    at::Tensor stats = target_stats(target, weight, n.ignore_index, classes.total, self.scalar_type());
    detail::all_reduce_over(*mesh, sample_split, stats, ReduceOp::Sum);
    check_on_device(stats[1] == 0, message);
    const LocalTargets local = local_targets(target, weight, n.ignore_index, classes);
    const bool mean = n.reduction == at::Reduction::Mean;
    const int64_t reduction = mean ? static_cast<int64_t>(at::Reduction::Sum) : n.reduction;
    const auto outs = call_local(op, {self, local.target, local.weight, reduction, kNotHere});
    const at::Tensor total_weight = stats[0];
    at::Tensor output = outs[0].toTensor();
    torch::jit::push(stack, mean ? output / total_weight : output,
                     n.per_element() ? at::zeros_like(total_weight) : total_weight);
  };
}

// nll_forward_kernel as graph ops; the check of the targets is an assertion in the graph.
GraphForm nll_forward_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const Nll n = nll_of(s, 0);
  const ClassRange classes = class_range(s, n, 0, chosen.inputs[0]);
  const std::vector<int64_t> sample_split = sample_mesh_dims(n, chosen.inputs[0]);
  const bool mean = n.reduction == at::Reduction::Mean;
  const int64_t reduction = mean ? static_cast<int64_t>(at::Reduction::Sum) : n.reduction;
  return [=, op = s.op_name(), dtype = s.input(0).meta.dtype, message = target_outside_message(s, n, classes)](
             GraphFormBuilder& b) -> std::vector<FormValue> {
    const FormValue self = b.input(0), target = b.input(1);
    const std::optional<FormValue> weight = n.has_weight ? std::optional(b.input(2)) : std::nullopt;
    const FormValue stats =
        all_reduce_form(b, target_stats_form(b, target, weight, n.ignore_index, classes.total, dtype), sample_split, ReduceOp::Sum);
    const FormValue outside = b.op("aten::select.int", {stats, int64_t{0}, int64_t{1}}, "targets_outside");
    b.op("aten::_assert_async.msg", {b.op("aten::eq.Scalar", {outside, int64_t{0}}, "none_outside"), c10::IValue(message)}, "check_targets");
    const LocalTargetsForm local = local_targets_form(b, target, weight, n.ignore_index, classes);
    const FormValue output = b.op(op, {self, local.target, local.weight, reduction, kNotHere}, "local_loss");
    const FormValue total_weight = b.op("aten::select.int", {stats, int64_t{0}, int64_t{0}}, "total_weight");
    return {mean ? b.op("aten::div.Tensor", {output, total_weight}, "mean") : output,
            n.per_element() ? b.op("aten::zeros_like", {total_weight}, "no_total_weight") : total_weight};
  };
}

// Backward on class-sharded self: the local op on this rank's classes. Sample shards need nothing:
// total_weight, the divisor of a mean, is already global.
LocalKernel nll_backward_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  const size_t self_input = *s.input_at_arg(1);
  const Nll n = nll_of(s, 1);
  if (mesh_dims_sharding(chosen.inputs[self_input], n.class_dim).empty()) return {};
  const ClassRange classes = class_range(s, n, self_input, chosen.inputs[self_input]);
  return [n, classes](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const at::Tensor weight = args[3].isNone() ? at::Tensor() : args[3].toTensor();
    const LocalTargets local = local_targets(args[2].toTensor(), weight, n.ignore_index, classes);
    torch::jit::push(stack, call_local(op, {args[0], args[1], local.target, local.weight, args[4], kNotHere, args[6]})[0]);
  };
}

// nll_backward_kernel as graph ops.
GraphForm nll_backward_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const size_t self_input = *s.input_at_arg(1);
  const Nll n = nll_of(s, 1);
  const ClassRange classes = class_range(s, n, self_input, chosen.inputs[self_input]);
  return [n, classes, op = s.op_name()](GraphFormBuilder& b) -> std::vector<FormValue> {
    const std::optional<FormValue> weight = n.has_weight ? std::optional(b.input(3)) : std::nullopt;
    const LocalTargetsForm local = local_targets_form(b, b.input(2), weight, n.ignore_index, classes);
    return {b.op(op, {b.input(0), b.input(1), local.target, local.weight, n.reduction, kNotHere, b.input(6)}, "local_grad")};
  };
}

// ---- mse_loss(self, target, reduction), mse_loss_backward(grad_output, self, target, reduction) ----

std::vector<DimStrategy> mse(const OpSchema& s) {
  const bool unreduced = s.args[2].toInt() == at::Reduction::None;
  const Shape shape = at::infer_size(s.input(0).meta.shape, s.input(1).meta.shape);
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
    out.push_back({{unreduced ? Shard(d) : Partial()}, aligned_inputs(s, shape, d)});
  return out;
}

// The gradient has the broadcast shape of grad_output, self and target (autograd sums it down).
std::vector<DimStrategy> mse_backward(const OpSchema& s) {
  const Shape& shape = s.outputs[0].shape;
  std::vector<DimStrategy> out = {all_replicate(s)};
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) out.push_back({{Shard(d)}, aligned_inputs(s, shape, d)});
  // The gradient is linear in grad_output.
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) out.push_back({{Partial(op)}, {Partial(op), Replicate(), Replicate()}});
  return out;
}

// A mean over sharded elements: the local op as a sum, divided by the GLOBAL element count, which
// the single-device kernels take from the broadcast self and target in forward, from self in backward.
LocalKernelRule global_mean(size_t reduction_arg) {
  return [reduction_arg](const OpSchema& s, const PlacementStrategy& chosen) -> LocalKernel {
    if (s.args[reduction_arg].toInt() != at::Reduction::Mean || !any_shard(chosen.inputs)) return {};
    const bool forward = reduction_arg == 2;
    const Shape counted = forward ? at::infer_size(s.input(0).meta.shape, s.input(1).meta.shape) : s.input(1).meta.shape;
    return [reduction_arg, count = numel(counted)](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
      auto args = torch::jit::pop(stack, op.schema().arguments().size());
      args[reduction_arg] = static_cast<int64_t>(at::Reduction::Sum);
      torch::jit::push(stack, call_local(op, std::move(args))[0].toTensor() / count);
    };
  };
}

// global_mean as graph ops: the op on local arguments as a sum, divided by the global count.
GraphFormRule global_mean_form(size_t reduction_arg) {
  return [reduction_arg](const OpSchema& s, const PlacementStrategy&) -> GraphForm {
    const bool forward = reduction_arg == 2;
    const Shape counted = forward ? at::infer_size(s.input(0).meta.shape, s.input(1).meta.shape) : s.input(1).meta.shape;
    return [reduction_arg, count = numel(counted), op = s.op_name(), is_tensor = tensor_arguments(s)](GraphFormBuilder& b) {
      const auto args = call_arguments(b, is_tensor, {{reduction_arg, static_cast<int64_t>(at::Reduction::Sum)}});
      return std::vector<FormValue>{b.op("aten::div.Scalar", {b.op(op, args, "local_sum"), count}, "mean")};
    };
  };
}

const bool loss_rules_registered = [] {
  using detail::register_family;
  using detail::register_overloads;  // the backward ops' out= overloads are named grad_input
  register_family({"aten::_log_softmax"},
                  {.dim = log_softmax, .local_kernel = sharded_log_softmax, .graph_form = sharded_log_softmax_form, .family = "loss"});
  register_family({"aten::_log_softmax_backward_data"}, {.dim = log_softmax_backward, .local_kernel = sharded_log_softmax_backward,
                                                         .graph_form = sharded_log_softmax_backward_form, .family = "loss"});
  register_family({"aten::nll_loss_forward", "aten::nll_loss2d_forward"},
                  {.dim = nll_forward, .local_kernel = nll_forward_kernel, .graph_form = nll_forward_form, .family = "loss"});
  register_overloads({"aten::nll_loss_backward", "aten::nll_loss2d_backward"},
                     {.dim = nll_backward, .local_kernel = nll_backward_kernel, .graph_form = nll_backward_form, .family = "loss"});
  register_family({"aten::mse_loss"}, {.dim = mse, .local_kernel = global_mean(2), .graph_form = global_mean_form(2), .family = "loss"});
  register_overloads({"aten::mse_loss_backward"},
                     {.dim = mse_backward, .local_kernel = global_mean(3), .graph_form = global_mean_form(3), .family = "loss"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
