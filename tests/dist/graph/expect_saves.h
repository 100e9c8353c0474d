#pragma once
// Every program a graph test makes must save as a .pt2 archive: no node may keep a local kernel that has
// no graph form. PyTorch then loads each saved program (graph_saved_programs_load_in_pytorch).

#include <gtest/gtest.h>

#include <string>

#include "../harness.h"
#include "../../support/test_models.h"
#include "dtensor/graph/program.h"

namespace dtensor::testing {

// Saves `program` as tp_<name>_rank<r>.pt2 where PyTorch loads it; a refusal fails the test. Rank 0 and
// the last rank save (the last holds the shortest of uneven shards, where a kernel's form can differ).
inline void expect_saves(const graph::Program& program, const std::string& name) {
  const int64_t rank = world()->rank();
  if (rank != 0 && rank != world()->size() - 1) return;
  try {
    graph::save_program(program, graph_saved("tp_" + name + "_rank" + std::to_string(rank) + ".pt2"));
  } catch (const std::exception& e) {
    ADD_FAILURE() << name << " does not save: " << e.what();
  }
}

}  // namespace dtensor::testing
