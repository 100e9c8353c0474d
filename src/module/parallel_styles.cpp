// What each tensor-parallel style does to a module: parameter placements, and the boundary
// conversions (forward hooks) PyTorch's styles install.

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "dtensor/api.h"
#include "dtensor/errors.h"
#include "dtensor/layout.h"
#include "dtensor/moe.h"
#include "dtensor/parallel.h"
#include "parallel_styles.h"

#include "context_sequence.h"

namespace dtensor::detail {
namespace {

// One style applied to one module: where the tensor-parallel dim is, and how to build full placements.
struct StyleTarget {
  const StyleContext& context;
  const std::string& path;
  torch::nn::Module& module;
  const char* style_name;

  // `tp` on the tensor-parallel dim, `others` on every other mesh dim.
  Placements on_mesh(const Placement& tp, const Placement& others) const {
    Placements out(context.mesh->ndim(), others);
    out[context.tp_dim] = tp;
    return out;
  }
  void distribute(const std::string& name, const Placement& tp) const {
    bool present = false;
    {  // the registry copy must be gone before the swap, which counts handles to the old tensor
      const auto params = module.named_parameters(/*recurse=*/false);
      const at::Tensor* param = params.find(name);
      present = param && param->defined();
    }
    if (!present) return;  // e.g. Linear without bias
    distribute_parameter(module, name, context.mesh, on_mesh(tp, Replicate()), path.empty() ? name : path + "." + name);
  }
  // Buffers (BatchNorm's running statistics) have no gradient to reduce: they are placed as they are.
  void distribute_buffer(const std::string& name, const Placement& tp) const {
    at::Tensor value;
    {  // as above, no handle to the old buffer may outlive the swap
      const auto buffers = module.named_buffers(/*recurse=*/false);
      const at::Tensor* buffer = buffers.find(name);
      if (!buffer || !buffer->defined()) return;
      value = distribute_tensor(*buffer, context.mesh, on_mesh(tp, Replicate()));
    }
    replace_buffer(module, name, std::move(value), path.empty() ? name : path + "." + name);
  }
  [[noreturn]] void unsupported(const char* supported) const {
    throw DTensorError(std::string(style_name) + " supports " + supported + "; '" + path + "' is a " + module.name() +
                       ". Use it on those layers, or PrepareModuleInput/PrepareModuleOutput for this module's boundary");
  }
};

template <typename... Impl>
bool is_any_of(torch::nn::Module& module) {
  return (... || (dynamic_cast<Impl*>(&module) != nullptr));
}

// A convolution's input channels, or nullopt for other modules.
std::optional<int64_t> conv_in_channels(torch::nn::Module& module) {
  if (auto* c = dynamic_cast<torch::nn::Conv1dImpl*>(&module)) return c->options.in_channels();
  if (auto* c = dynamic_cast<torch::nn::Conv2dImpl*>(&module)) return c->options.in_channels();
  if (auto* c = dynamic_cast<torch::nn::Conv3dImpl*>(&module)) return c->options.in_channels();
  return std::nullopt;
}

bool is_batch_norm(torch::nn::Module& module) {
  return is_any_of<torch::nn::BatchNorm1dImpl, torch::nn::BatchNorm2dImpl, torch::nn::BatchNorm3dImpl>(module);
}

// How a plain tensor argument becomes a DTensor: `tp` on the tensor-parallel dim, this rank's part of a
// dim-0 batch on the others. Without communication, so shards are taken to be even unless the caller
// knows the global size of one dim (a row-parallel Linear knows in_features), or a ContextParallel scope
// on the mesh knows its sequence's (context_sequence.h).
at::Tensor as_dtensor(const at::Tensor& input, const StyleContext& context, const Placement& tp,
                      std::optional<std::pair<int64_t, int64_t>> known_dim_size = std::nullopt) {
  if (is_dtensor(input)) return input;
  Placements placements(context.mesh->ndim(), input.dim() > 0 ? Shard(0) : Replicate());
  placements[context.tp_dim] = tp;
  placements = validate_placements(placements, context.mesh->ndim(), input.dim(), "a module input");
  Shape shape = global_shape_assuming_even(input.sizes().vec(), context.mesh->shape(), placements);
  if (known_dim_size) shape[known_dim_size->first] = known_dim_size->second;
  if (context.mesh->ndim() == 1 && placements[0].is_shard())
    if (const auto length = context_sequence_size(*context.mesh, input.size(placements[0].dim()))) shape[placements[0].dim()] = *length;
  Shape stride = contiguous_strides(shape);
  return from_local(input, context.mesh, placements, {.run_check = false, .shape = shape, .stride = stride});
}

// `tensor` with `tp` on the tensor-parallel dim (other dims unchanged); no-op when already there. Taken
// by value and moved on, so that a layer's fresh output is reduced in its own buffer (redistribute
// donates what nothing else holds).
at::Tensor with_tp_placement(at::Tensor tensor, const StyleContext& context, const Placement& tp) {
  Placements target = placements_of(tensor);
  target[context.tp_dim] = tp;
  target = validate_placements(target, context.mesh->ndim(), tensor.dim(), "a module boundary");
  return target == placements_of(tensor) ? tensor : redistribute(std::move(tensor), context.mesh, target);
}

// The input hook of styles that take the first Tensor argument as `input_layout` and want `desired`.
void convert_first_input(const StyleTarget& target, Placement input_layout, Placement desired,
                         std::optional<std::pair<int64_t, int64_t>> known_dim_size = std::nullopt) {
  const StyleContext context = target.context;
  register_forward_pre_hook(target.module, [=](torch::nn::Module& m, std::vector<at::Tensor>& inputs) {
    if (inputs.empty() || !inputs[0].defined()) return;
    inputs[0] = with_tp_placement(as_dtensor(inputs[0], context, input_layout, known_dim_size), context, desired);
  });
}

// The input hook of a row-parallel layer: its input read as `input` and moved to Shard(feature_dim).
// A plain input sharded on the feature dim is a column-parallel output: its global feature count is
// `features`, even when the shards are uneven.
void convert_row_parallel_input(const StyleTarget& target, Placement input, int64_t feature_dim, int64_t features) {
  const StyleContext context = target.context;
  register_forward_pre_hook(target.module, [=](torch::nn::Module&, std::vector<at::Tensor>& inputs) {
    if (inputs.empty() || !inputs[0].defined()) return;
    std::optional<std::pair<int64_t, int64_t>> known;
    if (input.is_sharding() && input.dim() == feature_dim)
      known = std::pair<int64_t, int64_t>{feature_dim < 0 ? feature_dim + inputs[0].dim() : feature_dim, features};
    inputs[0] = with_tp_placement(as_dtensor(inputs[0], context, input, known), context, Shard(feature_dim));
  });
}

// EmbeddingBag's arguments (indices, offsets, per-sample weights): a plain one is the same on every
// rank, Replicate on the whole mesh (see parallel.h).
void replicate_bag_inputs(const StyleTarget& target, const Placement& input_layout) {
  if (!input_layout.is_replicate())
    throw DTensorError(std::string(target.style_name) + " for '" + target.path + "': an EmbeddingBag's indices and "
                       "offsets are read as Replicate (offsets point into the whole index list); input_layout " +
                       input_layout.str() + " is not supported");
  const MeshPtr mesh = target.context.mesh;
  register_forward_pre_hook(target.module, [mesh](torch::nn::Module&, std::vector<at::Tensor>& inputs) {
    for (auto& input : inputs)
      if (input.defined() && !is_dtensor(input))
        input = from_local(input, mesh, Placements(mesh->ndim(), Replicate()), {.run_check = false});
  });
}

void convert_output(const StyleTarget& target, std::optional<Placement> input_layout, Placement output_layout,
                    bool use_local_output) {
  const StyleContext context = target.context;
  register_forward_hook(target.module, [=](torch::nn::Module&, at::Tensor out) {
    if (!out.defined()) return out;
    if (input_layout) out = as_dtensor(out, context, *input_layout);
    if (is_dtensor(out)) out = with_tp_placement(std::move(out), context, output_layout);
    return use_local_output && is_dtensor(out) ? to_local(out) : out;
  });
}

void apply(const StyleTarget& target, const ColwiseParallel& style) {
  torch::nn::Module& m = target.module;
  if (style.packed != 1)
    throw DTensorError("ColwiseParallel{.packed = " + std::to_string(style.packed) + "} on " + target.path +
                       ": packed layers are sharded by graph-level plans only (dtensor::graph::tensor_parallel_transform)");
  Placement features = Shard(-1);  // where the output's features are
  if (is_any_of<torch::nn::LinearImpl>(m) || conv_in_channels(m)) {
    target.distribute("weight", Shard(0));
    target.distribute("bias", Shard(0));
    if (conv_in_channels(m)) features = Shard(1);
    convert_first_input(target, style.input_layout, Replicate());
  } else if (is_any_of<torch::nn::EmbeddingImpl>(m)) {
    target.distribute("weight", Shard(1));
    convert_first_input(target, style.input_layout, Replicate());
  } else if (is_any_of<torch::nn::EmbeddingBagImpl>(m)) {
    target.distribute("weight", Shard(1));
    replicate_bag_inputs(target, style.input_layout);
  } else if (is_batch_norm(m)) {
    for (const char* name : {"weight", "bias"}) target.distribute(name, Shard(0));
    for (const char* name : {"running_mean", "running_var"}) target.distribute_buffer(name, Shard(0));
    features = Shard(1);
    convert_first_input(target, style.input_layout, features);
  } else {
    target.unsupported("torch::nn::Linear, Conv1d/2d/3d, BatchNorm1d/2d/3d, Embedding and EmbeddingBag");
  }
  convert_output(target, std::nullopt, style.output_layout.value_or(features), style.use_local_output);
}

void apply(const StyleTarget& target, const RowwiseParallel& style) {
  torch::nn::Module& m = target.module;
  if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(&m)) {
    target.distribute("weight", Shard(1));
    target.distribute("bias", Replicate());
    convert_row_parallel_input(target, style.input_layout.value_or(Shard(-1)), -1, linear->options.in_features());
  } else if (const auto in_channels = conv_in_channels(m)) {
    target.distribute("weight", Shard(1));
    target.distribute("bias", Replicate());
    convert_row_parallel_input(target, style.input_layout.value_or(Shard(1)), 1, *in_channels);
  } else if (is_any_of<torch::nn::EmbeddingImpl>(m)) {
    target.distribute("weight", Shard(0));
    convert_first_input(target, style.input_layout.value_or(Replicate()), Replicate());
  } else if (is_any_of<torch::nn::EmbeddingBagImpl>(m)) {
    target.distribute("weight", Shard(0));
    replicate_bag_inputs(target, style.input_layout.value_or(Replicate()));
  } else {
    target.unsupported("torch::nn::Linear, Conv1d/2d/3d, Embedding and EmbeddingBag");
  }
  convert_output(target, std::nullopt, style.output_layout, style.use_local_output);
}

void apply(const StyleTarget& target, const SequenceParallel& style) {
  for (const auto& param : target.module.named_parameters(/*recurse=*/false).keys()) target.distribute(param, Replicate());
  const StyleContext context = target.context;
  const Placement sequence = Shard(style.sequence_dim);
  register_forward_pre_hook(target.module, [=](torch::nn::Module&, std::vector<at::Tensor>& inputs) {
    for (auto& input : inputs)
      if (input.defined() && !is_dtensor(input)) input = as_dtensor(input, context, sequence);
  });
  if (style.use_local_output) convert_output(target, std::nullopt, sequence, true);
}

void apply(const StyleTarget& target, const PrepareModuleInput& style) {
  if (style.input_layouts.size() != style.desired_input_layouts.size())
    throw DTensorError("PrepareModuleInput for '" + target.path + "': input_layouts has " +
                       std::to_string(style.input_layouts.size()) + " entries but desired_input_layouts has " +
                       std::to_string(style.desired_input_layouts.size()) + "; give one of each per Tensor argument");
  const StyleContext context = target.context;
  const std::string path = target.path;
  register_forward_pre_hook(target.module, [=](torch::nn::Module&, std::vector<at::Tensor>& inputs) {
    if (inputs.size() < style.input_layouts.size())
      throw DTensorError("PrepareModuleInput for '" + path + "' describes " + std::to_string(style.input_layouts.size()) +
                         " Tensor arguments but forward got " + std::to_string(inputs.size()));
    for (size_t i = 0; i < style.input_layouts.size(); ++i) {
      if (!inputs[i].defined() || !style.input_layouts[i]) continue;
      at::Tensor input = as_dtensor(inputs[i], context, *style.input_layouts[i]);
      if (style.desired_input_layouts[i]) input = with_tp_placement(std::move(input), context, *style.desired_input_layouts[i]);
      inputs[i] = style.use_local_output ? to_local(input) : input;
    }
  });
}

void apply(const StyleTarget& target, const PrepareModuleOutput& style) {
  convert_output(target, style.output_layout, style.desired_output_layout, style.use_local_output);
}

void apply(const StyleTarget& target, const PrepareModuleInputOutput& style) {
  apply(target, style.input);
  apply(target, style.output);
}

void apply(const StyleTarget& target, const ExpertParallel&) {
  if (auto* experts = target.module.as<MoEExpertsImpl>()) {
    expert_parallel(*experts, target.context.mesh, target.context.tp_dim, target.path);
  } else if (auto* block = target.module.as<MoEImpl>()) {
    expert_parallel(*block, target.context.mesh, target.context.tp_dim, target.path);
  } else {
    throw DTensorError("ExpertParallel for '" + target.path + "': it applies to a dtensor::MoE block or its MoEExperts, not to a " +
                       target.module.name());
  }
}

const char* style_name(const ParallelStyle& style) {
  static constexpr const char* names[] = {"ColwiseParallel",    "RowwiseParallel",     "SequenceParallel",
                                          "PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput",
                                          "ExpertParallel"};
  static_assert(std::size(names) == std::variant_size_v<ParallelStyle>);
  return names[style.index()];
}

}  // namespace

void apply_style(const StyleContext& context, const std::string& path, torch::nn::Module& module,
                 const ParallelStyle& style) {
  const StyleTarget target{context, path, module, style_name(style)};
  std::visit([&](const auto& s) { apply(target, s); }, style);
}

}  // namespace dtensor::detail
