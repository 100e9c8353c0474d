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
#include "form_helpers.h"
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
GraphForm convolution_of_empty_shard(const OpSchema& s, const PlacementStrategy& chosen) {
  if (!empty_here(s, chosen, 0) && !empty_here(s, chosen, 1)) return {};
  const Shape shape = local_output_shape(s, chosen);
  return [shape, dtype = s.outputs[0].dtype, has_bias = s.input_at_arg(2).has_value()](GraphFormBuilder& b) {
    FormValue out = b.op("aten::new_zeros", {b.input(0), shape, c10::IValue(dtype)}, "zeros");
    if (has_bias) {
      const FormValue bias = b.op("aten::view", {b.input(2), per_channel_shape(static_cast<int64_t>(shape.size()))}, "bias");
      out = b.op("aten::add.Tensor", {out, bias}, "bias_only");
    }
    return std::vector<FormValue>{out};
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
GraphForm convolution_backward_of_empty_shard(const OpSchema& s, const PlacementStrategy& chosen) {
  if (!empty_here(s, chosen, 1) && !empty_here(s, chosen, 2)) return {};
  std::vector<Shape> shapes;  // of the asked outputs
  std::vector<c10::ScalarType> dtypes;
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    shapes.push_back(local_output_shape(s, chosen, k));
    dtypes.push_back(s.outputs[k].dtype);
  }
  return [shapes, dtypes, mask = asked_outputs(s), ndim = s.input_ndim(0)](GraphFormBuilder& b) {
    std::vector<FormValue> out;
    for (size_t k = 0; k < mask.size(); ++k) {
      if (!mask[k]) continue;
      const size_t i = out.size();
      out.push_back(k == 2 ? b.op("aten::sum.dim_IntList", {b.input(0), all_but_channels(ndim)}, "grad_bias")
                           : b.op("aten::new_zeros", {b.input(0), shapes[i], c10::IValue(dtypes[i])}, "zeros"));
    }
    return out;
  };
}

const bool conv_rules_registered = [] {
  using detail::register_overloads;
  const FormedKernel empty_shard = written_as_form(convolution_of_empty_shard);
  register_overloads({"aten::convolution"},
                     {.dim = convolution, .local_kernel = empty_shard.kernel, .graph_form = empty_shard.graph_form, .family = "conv"});
  const FormedKernel empty_shard_backward = written_as_form(convolution_backward_of_empty_shard);
  register_overloads({"aten::convolution_backward"},
                     {.dim = convolution_backward,
                      .local_args = local_bias_sizes,
                      .local_kernel = empty_shard_backward.kernel,
                      .graph_form = empty_shard_backward.graph_form,
                      .family = "conv"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
