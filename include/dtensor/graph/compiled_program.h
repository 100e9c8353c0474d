#pragma once
// A per-rank program compiled ahead of time by AOTInductor, run from C++ with no Python: the optional
// fast path beside the interpreter (which stays the default, and the oracle the tests hold it to).
//
//   // 1. each rank saves its program with sample inputs (what the compiler specialises for)
//   graph::save_program(local, dir + "/rank" + std::to_string(rank) + ".pt2", {.sample_inputs = {tokens}});
//   // 2. a build step, in the venv's Python (same torch):
//   //    python scripts/compile_rank_programs.py --threads 1 --out compiled programs/*.pt2
//   // 3. each rank runs its package on the mesh it was compiled for
//   graph::CompiledProgram compiled(compiled_dir + "/rank" + std::to_string(rank) + ".pt2", mesh);
//   at::Tensor logits = compiled.run({tokens})[0];
//   // training: a joint program's package computes with the program's parameters, which AdamW steps
//   compiled.use_state_of(step);            // torch::optim::AdamW adamw(graph::joint_parameters(step), ...)
//   at::Tensor loss = graph::take_joint_outputs(step, compiled.run({tokens, targets}));  adamw.step();
//
// A package is native code (a shared library inside a zip): load only packages you built. What it
// records is still checked before its code is loaded: the rank, the mesh (shape, ranks, dim names),
// the intra-op thread count its kernels were specialised for, and that this CPU has every instruction
// set extension the compiling machine had (kernels are built with -march=native). Its collectives
// find their process groups by name (derived from the mesh and its backend, graph::detail::
// group_name); this object registers the mesh's groups and refuses a package naming any other.
//
// Linking: target dtensor::compiled (it needs libtorch.so itself, not only libtorch_cpu, for the
// package's shared library to load).

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dtensor/device_mesh.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace dtensor::graph {
namespace detail {
class RegisteredGroup;
}

class Program;

class CompiledProgram {
 public:
  // Checks the package's record against this rank of `mesh`, the thread count and the CPU, registers
  // the mesh's process groups, then loads the package. Throws DTensorError naming the package and
  // what differs.
  CompiledProgram(const std::string& package_path, MeshPtr mesh);
  ~CompiledProgram();
  CompiledProgram(const CompiledProgram&) = delete;
  CompiledProgram& operator=(const CompiledProgram&) = delete;

  // Makes the package compute with `program`'s state tensors (the per-rank program it was compiled
  // from: the same names) instead of the copies compiled into it, without copying them: an optimizer
  // stepping joint_parameters(program) then updates what the package computes with, and
  // take_joint_outputs(program, run(...)) hands those parameters their gradients. Each tensor's dtype
  // and sizes are checked against the package's own.
  void use_state_of(Program& program);

  // Runs it on this rank's user inputs (dtype and static sizes checked against what it was compiled
  // for) and returns its outputs.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& user_inputs);

  const std::string& path() const { return path_; }

 private:
  struct InputRecord {
    std::string dtype;           // c10's name ("Long", "Float")
    std::vector<int64_t> shape;  // -1: dynamic
  };
  std::string path_;
  MeshPtr mesh_;
  std::vector<InputRecord> inputs_;
  std::vector<std::shared_ptr<detail::RegisteredGroup>> groups_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
};

}  // namespace dtensor::graph
