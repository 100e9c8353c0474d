// Convolutions: aten::convolution (what Conv1d/2d/3d and ConvTranspose reach on CPU; conv2d and
// friends decompose into it) and aten::convolution_backward. input [N, C_in, *spatial]; weight
// [C_out, C_in / groups, *kernel], or [C_in, C_out / groups, *kernel] when transposed; bias [C_out].
//
// - batch: input Shard(0), weight and bias Replicate -> output Shard(0);
// - output channels (a column-parallel conv): weight sharded on its C_out dim, bias Shard(0), input
//   Replicate -> output Shard(1);
// - input channels (a row-parallel conv): input Shard(1), weight sharded on its C_in dim -> each rank
//   convolves its channels and the results add up: output Partial(sum). The bias must be added once,
//   so it is taken as Partial(sum) too, which a Replicate bias becomes for free (the planner's local
//   partition keeps it on one rank and zeros on the others);
// - a convolution is linear in its input and in its weight: a Partial one with the other Replicate
//   stays Partial (the bias Partial alike; Avg only for floating values).
// Channel sharding needs groups == 1 (a grouped conv's channels would have to split along groups);
// spatial dims stay whole (sharding them would need halo exchanges).
// The backward strategies mirror these: with a batch-sharded input the weight and bias gradients sum
// over the batch (Partial), with output channels sharded the input gradient sums over them (Partial).

#include <ATen/ATen.h>
#include <ATen/core/stack.h>

#include "../registry.h"
#include "channels.h"
#include "optional_tensors.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

struct Conv {
  int64_t out_channels_dim;  // of the weight
  int64_t in_channels_dim;
  bool channels_shardable;
};

Conv conv_of(const OpSchema& s) {
  const bool transposed = argument(s, "transposed").toBool();
  return {transposed ? 1 : 0, transposed ? 0 : 1, argument(s, "groups").toInt() == 1};
}

// ---- convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)

std::vector<DimStrategy> convolution(const OpSchema& s) {
  const Conv c = conv_of(s);
  auto strategy = [&](Placement out, Placement input, Placement weight, Placement bias) {
    return DimStrategy{{out}, by_argument(s, [&](size_t arg) { return arg == 0 ? input : arg == 1 ? weight : bias; })};
  };
  std::vector<DimStrategy> out = {
      strategy(Replicate(), Replicate(), Replicate(), Replicate()),
      strategy(Shard(0), Shard(0), Replicate(), Replicate()),
  };
  if (c.channels_shardable) {
    out.push_back(strategy(Shard(1), Replicate(), Shard(c.out_channels_dim), Shard(0)));
    out.push_back(strategy(Partial(), Shard(1), Shard(c.in_channels_dim), Partial()));
  }
  for (ReduceOp op : linear_reduce_ops(s)) {
    out.push_back(strategy(Partial(op), Partial(op), Replicate(), Partial(op)));
    out.push_back(strategy(Partial(op), Replicate(), Partial(op), Partial(op)));
  }
  return out;
}

// A rank with no channels (or no samples) of an uneven shard: the CPU kernel rejects an empty weight
// and gives an input with no channels an output with none, while the result is just the bias (what a
// sum over no channels adds to).
LocalKernel convolution_of_empty_shard(const OpSchema& s, const PlacementStrategy& chosen) {
  if (!empty_here(s, chosen, 0) && !empty_here(s, chosen, 1)) return {};
  return [shape = local_output_shape(s, chosen), dtype = s.outputs[0].dtype](const c10::OperatorHandle& op,
                                                                              torch::jit::Stack& stack) {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    at::Tensor out = at::zeros(shape, args[0].toTensor().options().dtype(dtype));
    const at::Tensor bias = args[2].toOptional<at::Tensor>().value_or(at::Tensor());
    if (bias.defined()) out.add_(per_channel(bias, out.dim()));
    torch::jit::push(stack, out);
  };
}

// ---- convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> (grad_input?, grad_weight?, grad_bias?)

std::vector<DimStrategy> convolution_backward(const OpSchema& s) {
  const Conv c = conv_of(s);
  auto strategy = [&](Placements grads, Placement grad_output, Placement input, Placement weight) {
    return DimStrategy{asked(s, grads), by_argument(s, [&](size_t arg) {
                         return arg == 0 ? grad_output : arg == 1 ? input : weight;
                       })};
  };
  const Placement R = Replicate();
  std::vector<DimStrategy> out = {
      strategy({R, R, R}, R, R, R),
      strategy({Shard(0), Partial(), Partial()}, Shard(0), Shard(0), R),
  };
  if (c.channels_shardable) {
    out.push_back(
        strategy({Partial(), Shard(c.out_channels_dim), Shard(0)}, Shard(1), R, Shard(c.out_channels_dim)));
    out.push_back(strategy({Shard(1), Shard(c.in_channels_dim), R}, R, Shard(1), Shard(c.in_channels_dim)));
  }
  // grad_input is linear in grad_output and weight; grad_weight in grad_output and input; grad_bias
  // in grad_output.
  for (ReduceOp op : linear_reduce_ops(s)) {
    const Placement p = Partial(op);
    out.push_back(strategy({p, p, p}, p, R, R));
    out.push_back(strategy({R, p, R}, R, p, R));
    out.push_back(strategy({p, R, R}, R, R, p));
  }
  return out;
}

// bias_sizes is the global bias shape; the local call gets this rank's part of grad_bias.
LocalArgs local_bias_sizes(const OpSchema& s, const PlacementStrategy& chosen) {
  const size_t arg = *s.schema.argumentIndexWithName("bias_sizes");
  const std::vector<bool> mask = asked_outputs(s);
  if (s.args[arg].isNone() || !mask[2]) return {};
  const size_t grad_bias = static_cast<size_t>(mask[0]) + static_cast<size_t>(mask[1]);
  return {{arg, c10::IValue(local_output_shape(s, chosen, grad_bias))}};
}

// Empty shards again: no input or weight elements contribute nothing to grad_input and grad_weight,
// while grad_bias is the gradient summed over all but the channels.
LocalKernel convolution_backward_of_empty_shard(const OpSchema& s, const PlacementStrategy& chosen) {
  if (!empty_here(s, chosen, 1) && !empty_here(s, chosen, 2)) return {};
  const LocalKernel zeros = zero_outputs(s, chosen);
  const std::vector<bool> mask = asked_outputs(s);
  return [zeros, mask](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const at::Tensor grad_output = torch::jit::peek(stack, 0, op.schema().arguments().size()).toTensor();
    zeros(op, stack);
    if (mask[2]) stack.back() = grad_output.sum(all_but_channels(grad_output.dim()));
  };
}

const bool conv_rules_registered = [] {
  using detail::register_overloads;
  register_overloads({"aten::convolution"},
                     {.dim = convolution, .local_kernel = convolution_of_empty_shard, .family = "conv"});
  register_overloads({"aten::convolution_backward"},
                     {.dim = convolution_backward,
                      .local_args = local_bias_sizes,
                      .local_kernel = convolution_backward_of_empty_shard,
                      .family = "conv"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
