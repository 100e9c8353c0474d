#pragma once
// Autograd nodes for the DTensor API's differentiable functions. Hand-written nodes (rather than
// torch::autograd::Function) because their state is a DTensorSpec, not an IValue.

#include <ATen/core/DimVector.h>
#include <torch/csrc/autograd/function.h>

#include <memory>

#include "autograd_node_ptr.h"
#include "dtensor/spec.h"

namespace dtensor::detail {

// Gradient of from_local: the DTensor gradient as this rank's local gradient for `spec`'s placements.
// The spec is the forward output's own (shared, not copied: the parallel styles call from_local and
// to_local around every parallel layer of every step).
struct FromLocalBackward : torch::autograd::Node {
  explicit FromLocalBackward(std::shared_ptr<const DTensorSpec> spec) : spec(std::move(spec)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  std::string name() const override { return "dtensor::FromLocalBackward"; }
  std::shared_ptr<const DTensorSpec> spec;
};

// Gradient of to_local: the local gradient wrapped as a DTensor with `grad_spec`, after checking it has
// this rank's shard shape for it (`local_shape`, known when the node is made).
struct ToLocalBackward : torch::autograd::Node {
  ToLocalBackward(std::shared_ptr<const DTensorSpec> grad_spec, at::IntArrayRef local_shape)
      : grad_spec(std::move(grad_spec)), local_shape(local_shape) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  std::string name() const override { return "dtensor::ToLocalBackward"; }
  std::shared_ptr<const DTensorSpec> grad_spec;
  at::DimVector local_shape;
};

// Gradient of redistribute: the gradient moved back to the input's placements (Partial as Replicate).
struct RedistributeBackward : torch::autograd::Node {
  explicit RedistributeBackward(DTensorSpec input_spec) : input_spec(std::move(input_spec)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  std::string name() const override { return "dtensor::RedistributeBackward"; }
  DTensorSpec input_spec;
};

// Gradient of a redistribution to another mesh: the gradient moved back to the input's mesh and
// placements (Partial as Replicate). Every rank of both meshes runs it.
struct CrossMeshRedistributeBackward : torch::autograd::Node {
  explicit CrossMeshRedistributeBackward(DTensorSpec input_spec) : input_spec(std::move(input_spec)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  std::string name() const override { return "dtensor::CrossMeshRedistributeBackward"; }
  DTensorSpec input_spec;
};

// Connects `output` to `inputs` through `node` when grad mode is on and an input requires grad.
void record(const NodePtr& node, const at::Tensor& input, at::Tensor& output);

}  // namespace dtensor::detail
