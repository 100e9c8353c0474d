#pragma once
// Autograd nodes for the DTensor API's differentiable functions. Hand-written nodes (rather than
// torch::autograd::Function) because their state is a DTensorSpec, not an IValue.

#include <torch/csrc/autograd/function.h>

#include "dtensor/spec.h"

namespace dtensor::detail {

// Gradient of from_local: the DTensor gradient as this rank's local gradient for `spec`'s placements.
struct FromLocalBackward : torch::autograd::Node {
  explicit FromLocalBackward(DTensorSpec spec) : spec(std::move(spec)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  std::string name() const override { return "dtensor::FromLocalBackward"; }
  DTensorSpec spec;
};

// Gradient of to_local: the local gradient wrapped as a DTensor with `grad_spec`.
struct ToLocalBackward : torch::autograd::Node {
  explicit ToLocalBackward(DTensorSpec grad_spec) : grad_spec(std::move(grad_spec)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  std::string name() const override { return "dtensor::ToLocalBackward"; }
  DTensorSpec grad_spec;
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
void record(const c10::intrusive_ptr<torch::autograd::Node>& node, const at::Tensor& input, at::Tensor& output);

}  // namespace dtensor::detail
