#pragma once
// Which pipeline stage runs each op of a program's forward part (program_stages.h says the rules),
// and the one tensor each stage hands the next.

#include <string>
#include <unordered_map>
#include <vector>

#include "dtensor/graph/program.h"

namespace dtensor::graph::detail {

// A value computed from buffers and constants alone: every stage reading it computes it.
constexpr int kEveryStage = -1;

struct StageAssignment {
  int num_stages = 0;
  // A joint program's loss runs as one more part, index num_stages, after the last stage.
  bool has_loss = false;
  // Of the forward part's nodes (those the loss, or the forward program's output, reads).
  std::unordered_map<const Node*, int> node_stage;
  std::vector<const Node*> forward_part;  // in graph order
  // handed[k]: what part k passes part k + 1.
  std::vector<Value*> handed;
  Value* result = nullptr;  // what the last part returns: the loss, or the forward program's output

  int num_parts() const { return num_stages + (has_loss ? 1 : 0); }
};

// Raises DTensorError (split_program's refusals) where the program cannot be cut there.
StageAssignment assign_stages(const Program& program, const std::vector<std::string>& split_points);

}  // namespace dtensor::graph::detail
