#pragma once
// The graph training tests' check of one step: an expanded joint program called once on this rank's
// inputs gives the reference set's loss (PyTorch's, on the whole inputs), and every parameter's gradient
// is this rank's part of the reference's ("grad." + the parameter's name).

#include <map>
#include <string>
#include <vector>

#include "../harness.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/training.h"

namespace dtensor::testing {

inline void expect_joint_step_matches(graph::Program& step, const std::vector<c10::IValue>& local_inputs,
                                      const std::map<std::string, at::Tensor>& io, const MeshPtr& mesh) {
  EXPECT_TRUE(tensors_close(graph::joint_step(step, local_inputs), io.at("loss"), 1e-5, 1e-6));
  for (const graph::InputSpec& spec : step.inputs) {
    if (spec.kind != graph::InputSpec::Kind::Parameter) continue;
    const at::Tensor grad = step.state.at(spec.target).tensor().grad();
    EXPECT_TRUE(tensors_close(grad, expected_shard(io.at("grad." + spec.target), mesh, step.annotations.placements_of(*spec.value)), 1e-4, 1e-5))
        << spec.target;
  }
}

}  // namespace dtensor::testing
