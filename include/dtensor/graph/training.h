#pragma once
// Training with a joint forward+backward program (torch.export.experimental._export_forward_backward;
// whole, or expanded per rank by spmd_expand): its parameters as tensors an optimizer steps, and one
// call that runs the program and hands each parameter its gradient.
//
//   auto step = dtensor::graph::spmd_expand(dtensor::graph::load_program("gpt_joint.pt2"), mesh, where);
//   torch::optim::AdamW adamw(dtensor::graph::joint_parameters(step), torch::optim::AdamWOptions(1e-3));
//   for (...) {
//     at::Tensor loss = dtensor::graph::joint_step(step, dtensor::graph::local_user_inputs(step, {x, y}));
//     adamw.step();   // on this rank's shards; the program reads them at its next call
//   }

#include "dtensor/graph/program.h"

namespace torch::optim {
class Optimizer;
}

namespace dtensor::graph {

// The parameters the program outputs gradients for (its state tensors: this rank's parts of them in
// an expanded program), in the order of its GRADIENT_TO_PARAMETER outputs. Updating them in place
// updates the program. Raises DTensorError for a program without a LOSS_OUTPUT or gradients.
std::vector<at::Tensor> joint_parameters(Program& program);

// Runs the program on `user_inputs`, sets each parameter's grad to its gradient output (replacing
// the previous one) and returns the loss.
at::Tensor joint_step(Program& program, const std::vector<c10::IValue>& user_inputs, const RunOptions& options = {},
                      RunStats* stats = nullptr);

// Sets each parameter's grad to its gradient among `outputs` (the program's outputs as run() returns
// them, or as a package compiled from it does: graph::CompiledProgram) and returns the loss.
at::Tensor take_joint_outputs(Program& program, const std::vector<at::Tensor>& outputs);

// `steps` training steps on the same inputs (joint_step, then optimizer.step() on the parameters it
// was built over, joint_parameters(program)); returns each step's loss.
std::vector<double> train_steps(Program& program, torch::optim::Optimizer& optimizer, const std::vector<c10::IValue>& user_inputs,
                                int steps);

}  // namespace dtensor::graph
