// input_reshard: a module's forward recomputed in backward from its inputs, which are kept sharded over
// the tensor-parallel mesh in between (PyTorch's input_reshard with the activation checkpointing it is
// used with: LibTorch's saved-tensor hooks are Python-only, so C++ recomputes instead).

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "../tensor/autograd_node_ptr.h"
#include "dtensor/api.h"
#include "dtensor/errors.h"
#include "dtensor/parallel.h"

namespace dtensor {
namespace {

// One input as kept between forward and backward: `kept` sharded (or as it was, when it cannot be).
struct KeptInput {
  at::Tensor kept;
  bool was_plain = false;  // a plain tensor, kept as a DTensor: to_local when it is restored
  bool resharded = false;
  bool requires_grad = false;
};

KeptInput keep(const at::Tensor& input, const MeshPtr& mesh, int64_t dim) {
  KeptInput out{input.detach(), false, false, input.requires_grad()};
  if (!input.defined() || input.dim() <= dim) return out;
  const Placements replicate{Replicate()};
  if (is_dtensor(input)) {
    if (!same_mesh(mesh_of(input), mesh) || placements_of(input) != replicate) return out;
    out.kept = redistribute(input.detach(), Placements{Shard(dim)});
  } else {
    if (input.numel() < mesh->size()) return out;
    out.kept = redistribute(from_local(input.detach(), mesh, replicate, {.run_check = false}), Placements{Shard(dim)});
    out.was_plain = true;
  }
  out.resharded = true;  // Replicate to Shard cuts locally: no communication in forward
  return out;
}

at::Tensor restored(const KeptInput& input) {
  if (!input.resharded) return input.kept;
  const at::Tensor whole = redistribute(input.kept, Placements{Replicate()});  // the all-gather
  return input.was_plain ? to_local(whole) : whole;
}

struct InputReshardBackward : torch::autograd::Node {
  ForwardFunction forward;
  std::vector<KeptInput> inputs;
  at::Generator random;  // the CPU generator as forward found it: recomputed draws repeat forward's

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::vector<at::Tensor> again;
    for (const KeptInput& input : inputs) {
      at::Tensor value = restored(input).detach();
      again.push_back(input.requires_grad ? value.requires_grad_(true) : value);
    }
    at::Tensor output;
    {
      const torch::autograd::AutoGradMode grad_on(true);
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      const at::Generator after_forward = generator.clone();
      {
        std::lock_guard<std::mutex> lock(generator.mutex());
        generator.set_state(random.get_state());
      }
      output = forward(again);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(after_forward.get_state());
    }
    if (grads[0].defined() && output.requires_grad()) torch::autograd::backward({output}, {grads[0]});
    torch::autograd::variable_list out;
    for (const at::Tensor& input : again) out.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    return out;
  }
};

at::Tensor forward_keeping_sharded_inputs(const std::vector<at::Tensor>& inputs, const ForwardFunction& forward,
                                          const MeshPtr& mesh, int64_t dim) {
  if (!torch::autograd::GradMode::is_enabled()) return forward(inputs);
  auto node = detail::make_node<InputReshardBackward>();
  node->forward = forward;
  node->random = at::detail::getDefaultCPUGenerator().clone();
  at::Tensor output;
  {
    const torch::autograd::AutoGradMode grad_off(false);
    output = forward(inputs);
  }
  for (const at::Tensor& input : inputs) node->inputs.push_back(keep(input, mesh, dim));
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  torch::autograd::create_gradient_edge(output, node);
  return output;
}

}  // namespace

void input_reshard(torch::nn::Module& module, const MeshPtr& tp_mesh, std::optional<int64_t> input_reshard_dim) {
  if (!input_reshard_dim) return;
  if (!tp_mesh || tp_mesh->ndim() != 1)
    throw DTensorError("input_reshard for " + module.name() + ": give the 1-d tensor-parallel mesh (mesh[\"tp\"])" +
                       (tp_mesh ? ", not " + tp_mesh->str() : ""));
  if (*input_reshard_dim < 0) throw DTensorError("input_reshard for " + module.name() + ": the dim must be >= 0");
  const int64_t dim = *input_reshard_dim;
  register_forward_wrapper(module, [tp_mesh, dim](torch::nn::Module&, const std::vector<at::Tensor>& inputs, const ForwardFunction& forward) {
    return forward_keeping_sharded_inputs(inputs, forward, tp_mesh, dim);
  });
}

}  // namespace dtensor
