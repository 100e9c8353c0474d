#pragma once
// The graph training tests' reference loop: a joint program trained with AdamW, the same way for the
// expanded per-rank program and for the single-process one it is compared with.

#include <torch/optim/adamw.h>

#include <vector>

#include "dtensor/graph/program.h"
#include "dtensor/graph/training.h"

namespace dtensor::testing {

// Losses of `steps` AdamW steps (learning rate 1e-2) on the same inputs.
inline std::vector<double> adamw_losses(graph::Program& program, const std::vector<c10::IValue>& inputs, int steps) {
  torch::optim::AdamW adamw(graph::joint_parameters(program), torch::optim::AdamWOptions(1e-2));
  return graph::train_steps(program, adamw, inputs, steps);
}

}  // namespace dtensor::testing
