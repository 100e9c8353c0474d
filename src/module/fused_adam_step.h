#pragma once
// Adam's and AdamW's step as LibTorch's optimizers take it, with each param group's update in one
// ATen fused kernel (at::_fused_adam_ / at::_fused_adamw_) instead of about ten ops per parameter.

namespace torch::optim {
class Optimizer;
}

namespace dtensor::detail {

// Steps `optimizer` (its parameters plain tensors) when it is Adam or AdamW and the kernel takes every
// tensor: contiguous, and a gradient in its parameter's floating dtype. Its state objects are LibTorch's
// (made and counted as its step does), so the optimizer can go on with optimizer.step() or a checkpoint.
// False, with nothing changed, otherwise.
bool try_fused_adam_step(torch::optim::Optimizer& optimizer);

}  // namespace dtensor::detail
