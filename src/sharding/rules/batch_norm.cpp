// Batch normalisation: native_batch_norm (what BatchNorm1d/2d/3d and functional::batch_norm reach on
// CPU, training and eval), core ATen's forms of it (below), and native_batch_norm_backward /
// batch_norm_backward. input [N, C, *spatial]; weight, bias and the running statistics are per
// channel [C].
//
// - channels: input Shard(1), every per-channel tensor Shard(0): each rank normalises its channels,
//   no communication;
// - samples (the batch or a spatial dim sharded), per-channel tensors Replicate: in eval the running
//   statistics normalise every sample on its own; in training the batch statistics reduce over all
//   samples, so the local kernel all-reduces them first (SyncBatchNorm): the per-channel sum, then the
//   sum of squared deviations from the global mean, each divided by the GLOBAL count, which stays
//   exact for uneven shards. The running statistics then update as on one device (momentum, and the
//   unbiased variance for running_var) on every rank.
// Backward: the gradient is linear in grad_output (a Partial one stays Partial). With samples sharded,
// grad_weight and grad_bias are per-rank sums (Partial) unless the input's gradient is asked for in
// training: that needs their global values, so they are all-reduced and come out Replicate.
// In training the op also updates the running statistics in place, so they keep their placements
// (batch_norm_on_mesh). In eval the op returns empty save_mean / save_invstd, left Replicate.

#include <ATen/ATen.h>
#include <ATen/core/stack.h>

#include <algorithm>

#include "../propagation.h"
#include "../registry.h"
#include "dtensor/errors.h"
#include "channels.h"
#include "form_helpers.h"
#include "optional_tensors.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

// The mesh dims on which `input` placements split the samples of a channel.
std::vector<int64_t> sample_split(const Placements& input) {
  std::vector<int64_t> out;
  for (int64_t m = 0; m < static_cast<int64_t>(input.size()); ++m)
    if (input[m].is_shard() && input[m].dim() != 1) out.push_back(m);
  return out;
}

// Elements per channel over the whole input, and the bytes of one per-channel statistic.
struct Counts {
  int64_t per_channel;
  double statistic_bytes;
};

Counts counts_of(const OpSchema& s, size_t input) {
  const Shape& shape = s.input(input).meta.shape;
  return {numel(shape) / std::max<int64_t>(shape[1], 1),
          static_cast<double>(shape[1] * static_cast<int64_t>(c10::elementSize(s.input(input).meta.dtype)))};
}

// ---- native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
// -> (out, save_mean, save_invstd), and core ATen's forms of it:
//  - _native_batch_norm_legit: the same (running statistics marked written);
//  - _native_batch_norm_legit.no_stats(input, weight?, bias?, training, momentum, eps): none kept;
//  - _native_batch_norm_legit_no_training(input, weight?, bias?, running_mean, running_var, momentum,
//    eps): eval;
//  - _native_batch_norm_legit_functional: returns the updated running statistics instead of writing
//    them (running_mean_out, running_var_out);
//  - _batch_norm_with_update(input, weight?, bias?, running_mean!, running_var!, momentum, eps): training,
//    and a reserve tensor (empty on CPU) after the saved statistics; _functional: returns the running
//    statistics as well.

// How one form takes and returns what the others do.
struct BatchNormForm {
  bool training;
  std::optional<size_t> running_mean, running_var;  // argument indices
  size_t momentum, eps;
  bool updates_in_place;  // running statistics written in place (native_batch_norm's unmarked)
  bool returns_reserve;
  bool returns_running;
};

BatchNormForm form_of(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  BatchNormForm f;
  const std::string& name = schema.name();
  const auto training = schema.argumentIndexWithName("training");
  f.training = training ? args[*training].toBool() : name == "aten::_batch_norm_with_update" || name == "aten::_batch_norm_with_update_functional";
  f.running_mean = schema.argumentIndexWithName("running_mean");
  f.running_var = schema.argumentIndexWithName("running_var");
  f.momentum = *schema.argumentIndexWithName("momentum");
  f.eps = *schema.argumentIndexWithName("eps");
  f.returns_reserve = name == "aten::_batch_norm_with_update" || name == "aten::_batch_norm_with_update_functional";
  f.returns_running = name == "aten::_native_batch_norm_legit_functional" || name == "aten::_batch_norm_with_update_functional";
  f.updates_in_place = f.training && f.running_mean && !f.returns_running;
  return f;
}

BatchNormForm form_of(const OpSchema& s) { return form_of(s.schema, s.args); }

std::vector<DimStrategy> batch_norm(const OpSchema& s) {
  const BatchNormForm form = form_of(s);
  const bool training = form.training;
  const Counts counts = counts_of(s, 0);
  auto strategy = [&](Placement input, Placement per_channel, Placement statistics, double cost) {
    Placements outputs = {input, statistics, statistics};
    if (form.returns_reserve) outputs.push_back(Replicate());
    if (form.returns_running) outputs.insert(outputs.end(), {per_channel, per_channel});
    return DimStrategy{outputs, by_argument(s, [&](size_t arg) { return arg == 0 ? input : per_channel; }), cost};
  };
  std::vector<DimStrategy> out = {
      strategy(Replicate(), Replicate(), Replicate(), 0),
      strategy(Shard(1), Shard(0), training ? Shard(0) : Replicate(), 0),
  };
  // Training all-reduces two statistics (sum, then squared deviations).
  const double sync_cost = training ? 2 * (kCollectiveLatencyBytes + counts.statistic_bytes) : 0;
  for (int64_t d : all_but_channels(s.input_ndim(0))) out.push_back(strategy(Shard(d), Replicate(), Replicate(), sync_cost));
  return out;
}

// native_batch_norm's schema does not mark the running statistics as written, though the op updates
// them in place in training: dispatch would redistribute them like any input and the update would
// land in a copy. So in training only the strategies that take them as they are remain (Replicate
// where samples are sharded or nothing is, Shard(0) where channels are, alike for both).
OpStrategy batch_norm_on_mesh(const OpSchema& s) {
  OpStrategy all = detail::expand_dim_strategies(batch_norm(s), s.mesh->ndim(), s.outputs.size(), s.inputs.size());
  const BatchNormForm form = form_of(s);
  if (!form.updates_in_place) return all;
  std::vector<size_t> written;
  for (size_t arg : {*form.running_mean, *form.running_var})
    if (const auto i = s.input_at_arg(arg)) written.push_back(*i);
  std::erase_if(all, [&](const PlacementStrategy& st) {
    return std::any_of(written.begin(), written.end(), [&](size_t i) { return st.inputs[i] != s.input(i).placements; });
  });
  if (all.empty()) {
    std::string stats;
    for (size_t i : written) stats += (stats.empty() ? "" : ", ") + to_string(s.input(i).placements);
    throw DTensorError(s.schema.name() + " has no sharding strategy that keeps the placements of the tensor it writes to: "
                       "it updates running_mean and running_var (" + stats + ") in place, and they must be Replicate, "
                       "or Shard(0) on the mesh dims that shard the input's channels, alike; redistribute them first");
  }
  return all;
}

// Training over sharded samples: the batch statistics all-reduced, then normalise and update the
// running statistics as the single-device kernel does. The form returns the op's outputs; where the op
// writes the running statistics in place (native_batch_norm, _native_batch_norm_legit,
// _batch_norm_with_update), it returns their new values after them, which the kernel copies in.
GraphForm synced_batch_norm(const OpSchema& s, std::vector<int64_t> split) {
  const BatchNormForm form = form_of(s);
  auto defined = [&](std::optional<size_t> arg) { return arg && s.input_at_arg(*arg).has_value(); };
  const bool weight = defined(1), bias = defined(2), running = defined(form.running_mean) && defined(form.running_var);
  return [form, split, weight, bias, running, count = counts_of(s, 0).per_channel, ndim = s.input_ndim(0)](GraphFormBuilder& b) {
    const double momentum = b.argument(form.momentum).toDouble(), eps = b.argument(form.eps).toDouble();
    const std::vector<int64_t> dims = all_but_channels(ndim);
    auto broadcast = [&](FormValue per_channel) { return b.op("aten::view", {per_channel, per_channel_shape(ndim)}, "per_channel"); };
    const FormValue x = b.input(0);
    const FormValue sum = all_reduce_form(b, b.op("aten::sum.dim_IntList", {x, dims}, "sum"), split, ReduceOp::Sum);
    const FormValue mean = b.op("aten::div.Scalar", {sum, static_cast<double>(count)}, "mean");
    const FormValue centered = b.op("aten::sub.Tensor", {x, broadcast(mean)}, "centered");
    const FormValue squared = b.op("aten::mul.Tensor", {centered, centered}, "squared");
    const FormValue squares = all_reduce_form(b, b.op("aten::sum.dim_IntList", {squared, dims}, "squares"), split, ReduceOp::Sum);
    const FormValue variance = b.op("aten::div.Scalar", {squares, static_cast<double>(count)}, "variance");
    const FormValue invstd = b.op("aten::rsqrt", {b.op("aten::add.Scalar", {variance, eps}, "variance_eps")}, "invstd");
    FormValue out = b.op("aten::mul.Tensor", {centered, broadcast(invstd)}, "normalized");
    if (weight) out = b.op("aten::mul.Tensor", {out, broadcast(b.input(1))}, "scaled");
    if (bias) out = b.op("aten::add.Tensor", {out, broadcast(b.input(2))}, "shifted");
    std::vector<FormValue> outputs = {out, mean, invstd};
    if (form.returns_reserve) outputs.push_back(b.op("aten::new_empty", {x, std::vector<int64_t>{0}, c10::IValue(at::kByte)}, "reserve"));
    if (running && (form.returns_running || form.updates_in_place)) {
      // running * (1 - momentum) + statistic * momentum, the variance unbiased.
      auto updated = [&](size_t arg, FormValue statistic) {
        const FormValue kept = b.op("aten::mul.Scalar", {b.input(arg), 1 - momentum}, "kept");
        return b.op("aten::add.Tensor", {kept, b.op("aten::mul.Scalar", {statistic, momentum}, "new")}, "running");
      };
      const FormValue unbiased = b.op("aten::div.Scalar", {squares, static_cast<double>(count - 1)}, "unbiased");
      outputs.insert(outputs.end(), {updated(*form.running_mean, mean), updated(*form.running_var, unbiased)});
    }
    return outputs;
  };
}

// The op's computation as a form: the synchronised statistics where training splits the samples, zeros
// on a shard without channels (the CPU kernel rejects it).
GraphForm batch_norm_computation(const OpSchema& s, const PlacementStrategy& chosen) {
  auto split = sample_split(chosen.inputs[0]);
  if (form_of(s).training && !split.empty()) return synced_batch_norm(s, std::move(split));
  if (empty_here(s, chosen, 0)) return zeros_of_asked_outputs(s, chosen);
  return {};
}

// Eager: the computation, and the new running statistics it leaves after the op's outputs (where the op
// writes them in place) copied into the op's running_mean and running_var.
LocalKernel batch_norm_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  GraphForm computation = batch_norm_computation(s, chosen);
  if (!computation) return {};
  return [computation, mesh = s.mesh, form = form_of(s)](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const size_t n = op.schema().arguments().size(), start = stack.size() - n;
    auto running = [&](std::optional<size_t> arg) { return arg ? stack[start + *arg] : c10::IValue(); };
    const c10::IValue running_mean = running(form.running_mean), running_var = running(form.running_var);
    detail::run_graph_form(computation, *mesh, op, stack);
    if (stack.size() - start == op.schema().returns().size()) return;
    running_var.toTensor().copy_(torch::jit::pop(stack).toTensor());
    running_mean.toTensor().copy_(torch::jit::pop(stack).toTensor());
  };
}

// Graph nodes are functional: where the op writes its running statistics in place, the computation's
// outputs outnumber the node's, and the kernel stays.
GraphForm batch_norm_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const bool writes_running = form_of(s).updates_in_place && !sample_split(chosen.inputs[0]).empty();
  return writes_running ? GraphForm{} : batch_norm_computation(s, chosen);
}

// ---- native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
// save_invstd?, train, eps, output_mask) -> (grad_input?, grad_weight?, grad_bias?)

// Training with grad_input asked for: it needs the global sums of grad_out and grad_out * x_hat.
// (native_batch_norm_backward says "train", batch_norm_backward "update".)
bool training_backward(const OpSchema& s) {
  return argument(s, s.schema.argumentIndexWithName("train") ? "train" : "update").toBool();
}
bool syncs(const OpSchema& s) { return training_backward(s) && asked_outputs(s)[0]; }

std::vector<DimStrategy> batch_norm_backward(const OpSchema& s) {
  const bool training = training_backward(s);
  const Counts counts = counts_of(s, 1);
  // grad_out and input ("activations"), weight and running statistics ("per_channel"), and the saved
  // batch statistics.
  auto strategy = [&](Placements grads, Placement grad_out, Placement input, Placement per_channel,
                      Placement saved, double cost = 0) {
    return DimStrategy{asked(s, grads), by_argument(s, [&](size_t arg) {
                         // (batch_norm_backward's reserve, argument 10, is empty on CPU.)
                         return arg == 0 ? grad_out : arg == 1 ? input : arg == 10 ? Placement(Replicate()) : arg >= 5 ? saved : per_channel;
                       }),
                       cost};
  };
  const Placement R = Replicate();
  std::vector<DimStrategy> out = {
      strategy({R, R, R}, R, R, R, R),
      strategy({Shard(1), Shard(0), Shard(0)}, Shard(1), Shard(1), Shard(0), training ? Shard(0) : R),
  };
  for (int64_t d : all_but_channels(s.input_ndim(1))) {
    if (syncs(s))  // one all-reduce of both sums
      out.push_back(strategy({Shard(d), R, R}, Shard(d), Shard(d), R, R, kCollectiveLatencyBytes + 2 * counts.statistic_bytes));
    else
      out.push_back(strategy({Shard(d), Partial(), Partial()}, Shard(d), Shard(d), R, R));
  }
  for (ReduceOp op : linear_reduce_ops(s)) {
    const Placement p = Partial(op);
    out.push_back(strategy({p, p, p}, p, R, R, R));
  }
  return out;
}

// grad_input = invstd * weight * (g - mean(g) - x_hat * mean(g * x_hat)), the means over all samples
// of a channel: their sums are grad_bias and grad_weight, all-reduced once.
GraphForm synced_batch_norm_backward(const OpSchema& s, std::vector<int64_t> split) {
  return [split = std::move(split), count = counts_of(s, 1).per_channel, mask = asked_outputs(s), ndim = s.input_ndim(1),
          weight = s.input_at_arg(2).has_value()](GraphFormBuilder& b) {
    const std::vector<int64_t> dims = all_but_channels(ndim);
    auto broadcast = [&](FormValue per_channel) { return b.op("aten::view", {per_channel, per_channel_shape(ndim)}, "per_channel"); };
    const FormValue grad = b.input(0), x = b.input(1), mean = b.input(5), invstd = b.input(6);
    const FormValue x_hat = b.op("aten::mul.Tensor", {b.op("aten::sub.Tensor", {x, broadcast(mean)}, "centered"), broadcast(invstd)}, "x_hat");
    const FormValue grad_x_hat = b.op("aten::mul.Tensor", {grad, x_hat}, "grad_x_hat");
    const FormValue sums = all_reduce_form(
        b, b.op("aten::stack", {std::vector<FormValue>{b.op("aten::sum.dim_IntList", {grad, dims}, "grad_sum"),
                                                       b.op("aten::sum.dim_IntList", {grad_x_hat, dims}, "grad_x_hat_sum")}},
                "sums"),
        split, ReduceOp::Sum);
    const FormValue grad_bias = b.op("aten::select.int", {sums, 0, 0}, "grad_bias");
    const FormValue grad_weight = b.op("aten::select.int", {sums, 0, 1}, "grad_weight");
    const FormValue scale = weight ? b.op("aten::mul.Tensor", {invstd, b.input(2)}, "scale") : invstd;
    auto per_sample = [&](FormValue sum) { return broadcast(b.op("aten::div.Scalar", {sum, static_cast<double>(count)}, "mean")); };
    const FormValue centered_grad = b.op("aten::sub.Tensor", {grad, per_sample(grad_bias)}, "centered_grad");
    const FormValue projected = b.op("aten::mul.Tensor", {x_hat, per_sample(grad_weight)}, "projected");
    const FormValue grad_input =
        b.op("aten::mul.Tensor", {b.op("aten::sub.Tensor", {centered_grad, projected}, "difference"), broadcast(scale)}, "grad_input");
    std::vector<FormValue> out;
    const FormValue all[] = {grad_input, grad_weight, grad_bias};
    for (size_t k = 0; k < mask.size(); ++k)
      if (mask[k]) out.push_back(all[k]);
    return out;
  };
}

GraphForm batch_norm_backward_form(const OpSchema& s, const PlacementStrategy& chosen) {
  auto split = sample_split(chosen.inputs[1]);
  if (syncs(s) && !split.empty()) return synced_batch_norm_backward(s, std::move(split));
  // The CPU kernel divides by zero on a shard without samples or channels.
  if (empty_here(s, chosen, 1)) return zeros_of_asked_outputs(s, chosen);
  return {};
}

const bool batch_norm_rules_registered = [] {
  using detail::register_overloads;
  // _native_batch_norm_legit (core ATen's form, running statistics required) takes the same arguments.
  register_overloads({"aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit.no_stats",
                      "aten::_native_batch_norm_legit_no_training", "aten::_native_batch_norm_legit_functional",
                      "aten::_batch_norm_with_update", "aten::_batch_norm_with_update_functional"},
                     {.mesh = batch_norm_on_mesh,
                      .local_kernel = batch_norm_kernel,
                      .graph_form = batch_norm_form,
                      .family = "norm",
                      .strided_shards = detail::StridedShards::Own});
  const FormedKernel backward = written_as_form(batch_norm_backward_form);
  register_overloads({"aten::native_batch_norm_backward", "aten::batch_norm_backward"},
                     {.dim = batch_norm_backward, .local_kernel = backward.kernel, .graph_form = backward.graph_form, .family = "norm"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
