#pragma once
// Every program a graph test makes must save as a .pt2 archive: no node may keep a local kernel that has
// no graph form. PyTorch then loads each saved program on every rank, runs it with its process groups
// and compares what it computes with dtensor's interpreter (scripts/run_saved_rank_programs.py, ctest
// graph_saved_programs_run_in_pytorch).

#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <string>
#include <vector>

#include "../harness.h"
#include "../../support/test_models.h"
#include "dtensor/graph/program.h"

namespace dtensor::testing {

// Every tensor in `v` (a tensor, or lists and tuples of them), in order.
inline void append_tensors(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(t);
  else if (v.isList())
    for (const c10::IValue& item : v.toListRef()) append_tensors(item, out);
  else if (v.isTuple())
    for (const c10::IValue& item : v.toTupleRef().elements()) append_tensors(item, out);
}

// Saves this rank's `program` as tp_<name>_rank<r>.pt2 with `inputs` as its sample inputs, and what
// dtensor's interpreter computes from them as tp_<name>_rank<r>.expected.pt (torch.load reads what pickle_save writes); a
// refusal to save fails the test.
inline void expect_saves(graph::Program& program, const std::string& name, const std::vector<c10::IValue>& inputs) {
  const std::string base = graph_saved("tp_" + name + "_rank" + std::to_string(world()->rank()));
  try {
    graph::save_program(program, base + ".pt2", {.sample_inputs = inputs});
  } catch (const std::exception& e) {
    ADD_FAILURE() << name << " does not save: " << e.what();
    return;
  }
  std::vector<at::Tensor> outputs;
  for (const c10::IValue& v : graph::run(program, inputs)) append_tensors(v, outputs);
  // A tuple: torch.load's weights_only reads it (typed lists carry a type tag it refuses).
  const std::vector<char> bytes =
      torch::jit::pickle_save(c10::ivalue::Tuple::create(std::vector<c10::IValue>(outputs.begin(), outputs.end())));
  std::ofstream(base + ".expected.pt", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace dtensor::testing
