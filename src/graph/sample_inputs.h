#pragma once
// What save_program records besides the graph, for tools that compile a saved program: its example
// inputs (data/sample_inputs/model.pt, which torch.export.load returns as ep.example_inputs and
// AOTInductor compiles against) and, for a per-rank program, which rank of which mesh it is
// (extra/dtensor.json, read by scripts/compile_rank_programs.py).

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace dtensor::graph {
class Program;
}

namespace dtensor::graph::detail {

// `inputs` as torch.save writes `(tuple(inputs), {})`: a zip holding a pickle whose tensors are
// persistent storages, with untagged lists and dicts so that torch.load(weights_only=True) reads it.
// Each input must match the program's user input in kind, dtype and static sizes.
std::string sample_inputs_archive(const Program& program, const std::vector<c10::IValue>& inputs);

// A per-rank program's record: {"rank", "mesh": {"shape", "ranks", "dim_names", "backend"},
// "process_groups": [names its collectives use], "inputs": [{"dtype" (c10's name), "shape" (-1 where
// dynamic)} per user input]}, as JSON text.
std::string rank_program_record(const Program& program);

}  // namespace dtensor::graph::detail
