#pragma once
// The graph training tests' check of one step: an expanded joint program called once on this rank's
// inputs gives the reference set's loss (PyTorch's, on the whole inputs), and every parameter's gradient
// is this rank's part of the reference's ("grad." + the parameter's name).

#include <map>
#include <string>
#include <vector>

#include "../harness.h"
#include "../../support/test_models.h"
#include "adamw_losses.h"
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

// A Hugging Face family's joint program (scripts/export_hf_models.py) and PyTorch's reference set:
// input_ids, labels, the loss and every gradient.
struct HuggingFaceJoint {
  std::string archive;
  std::map<std::string, at::Tensor> io;
  std::vector<c10::IValue> inputs;
};
inline HuggingFaceJoint hugging_face_joint(const std::string& family) {
  HuggingFaceJoint j{graph_model("hf/" + family + "_joint.pt2"), tensor_map("hf/" + family + "_joint_io"), {}};
  j.inputs = {j.io.at("input0"), j.io.at("input1")};
  return j;
}

// 5 AdamW steps of the expanded `step` on this rank's inputs follow those of the `whole` program in one
// process (relative 1e-4), and the loss falls.
inline void expect_adamw_follows_whole(graph::Program& step, const std::vector<c10::IValue>& local_inputs, graph::Program& whole,
                                       const std::vector<c10::IValue>& inputs) {
  constexpr int kSteps = 5;
  const std::vector<double> losses = adamw_losses(step, local_inputs, kSteps), expected = adamw_losses(whole, inputs, kSteps);
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(losses[s], expected[s], 1e-4 * std::abs(expected[s])) << "step " << s;
  EXPECT_LT(losses.back(), losses.front());
}

}  // namespace dtensor::testing
