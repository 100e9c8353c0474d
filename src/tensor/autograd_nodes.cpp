#include "autograd_nodes.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "../redistribute/cross_mesh.h"
#include "../redistribute/executor.h"
#include "donation.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"

namespace dtensor::detail {
// A gradient is never Partial where its tensor was: it is the same logical value, so the reduced
// (Replicate) form (partial_as_replicate) is the one to hand back.

torch::autograd::variable_list FromLocalBackward::apply(torch::autograd::variable_list&& grads) {
  if (!grads[0].defined()) return {at::Tensor()};
  const at::Tensor gradient = std::move(grads[0]);  // the engine's gradient, often held by nothing else
  const auto& grad = dtensor_impl(gradient, "the gradient flowing back into from_local");
  // Reduce any Partial gradient first: each rank's contribution to a Partial input enters the value
  // with coefficient 1 (sum) or 1/n (avg), so it needs the whole gradient, not a contribution of it.
  // (The all-reduce works in the gradient's own buffer when nothing else can see it.)
  const Placements reduced = partial_as_replicate(spec->placements);
  at::Tensor local = redistribute_local(grad.local(), grad.spec(), reduced, Direction::Forward,
                                        donatable(gradient) ? Ownership::Donated : Ownership::Borrowed);
  return {redistribute_local(local, grad.spec().with_placements(reduced), spec->placements, Direction::Backward)};
}

torch::autograd::variable_list ToLocalBackward::apply(torch::autograd::variable_list&& grads) {
  const at::Tensor& grad = grads[0];
  if (!grad.defined()) return {at::Tensor()};
  if (is_dtensor(grad))
    throw DTensorError("the gradient of to_local's output is itself a DTensor; the local tensor's gradient must be "
                       "a plain tensor");
  if (grad_spec->mesh->coordinate() && grad.sizes() != at::IntArrayRef(local_shape))
    throw DTensorError("the gradient of to_local's output has shape " + shape_str(grad.sizes().vec()) +
                       " but the local shard for grad_placements (" + to_string(grad_spec->placements) +
                       ") has shape " + shape_str(Shape(local_shape.begin(), local_shape.end())));
  std::shared_ptr<const DTensorSpec> spec = grad_spec;
  if (grad.scalar_type() != spec->meta.dtype) {
    DTensorSpec retyped = *spec;
    retyped.meta.dtype = grad.scalar_type();
    spec = std::make_shared<const DTensorSpec>(std::move(retyped));
  }
  at::Tensor local = in_global_layout(grad, spec->meta);  // before `spec` is moved from
  return {make_dtensor(local, std::move(spec))};
}

torch::autograd::variable_list RedistributeBackward::apply(torch::autograd::variable_list&& grads) {
  if (!grads[0].defined()) return {at::Tensor()};
  const auto& grad = dtensor_impl(grads[0], "the gradient flowing back into redistribute");
  const Placements target = partial_as_replicate(input_spec.placements);
  DTensorSpec spec{input_spec.mesh, target, input_spec.meta};
  spec.meta.dtype = grad.spec().meta.dtype;
  at::Tensor local = in_global_layout(redistribute_local(grad.local(), grad.spec(), target), spec.meta);
  return {make_dtensor(local, std::move(spec))};
}

torch::autograd::variable_list CrossMeshRedistributeBackward::apply(torch::autograd::variable_list&& grads) {
  if (!grads[0].defined()) return {at::Tensor()};
  const auto& grad = dtensor_impl(grads[0], "the gradient flowing back into a cross-mesh redistribute");
  const DTensorSpec reduced = grad.spec().with_placements(partial_as_replicate(grad.spec().placements));
  const at::Tensor grad_local = redistribute_local(grad.local(), grad.spec(), reduced.placements);
  DTensorSpec spec{input_spec.mesh, partial_as_replicate(input_spec.placements), input_spec.meta};
  spec.meta.dtype = grad.spec().meta.dtype;
  at::Tensor local = in_global_layout(move_across_meshes(grad_local, reduced, spec), spec.meta);
  return {make_dtensor(local, std::move(spec))};
}

void record(const NodePtr& node, const at::Tensor& input, at::Tensor& output) {
  if (!torch::autograd::GradMode::is_enabled() || !input.requires_grad()) return;
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::create_gradient_edge(output, node);
}

}  // namespace dtensor::detail
