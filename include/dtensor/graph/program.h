#pragma once
// An exported program: a graph, its signature (which graph inputs are parameters, buffers, constants
// or user inputs; which outputs are user outputs, buffer mutations, the loss or gradients) and its
// state (the tensors behind parameters, buffers and constants).
//
//   auto program = dtensor::graph::load_program("gpt.pt2");      // torch.export.save's archive
//   std::vector<at::Tensor> out = dtensor::graph::run(program, {tokens});
//   dtensor::graph::save_program(program, "copy.pt2");           // torch.export.load reads it
//
// Weights stay in the archive until asked for: a tensor is read whole (tensor()) or as the part one
// rank keeps (shard()), which reads only that part's bytes.

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/graph/ir.h"

namespace dtensor::io {
class ZipArchive;
struct ZipEntry;
}  // namespace dtensor::io

namespace dtensor::graph {
namespace detail {
class RegisteredGroup;
}

struct InputSpec {
  enum class Kind { Parameter, Buffer, TensorConstant, UserInput };
  Kind kind;
  Value* value;        // the graph input
  std::string target;  // the state's name (FQN) for parameters, buffers and constants
  bool persistent = true;
};

struct OutputSpec {
  enum class Kind { UserOutput, BufferMutation, LossOutput, GradientToParameter, GradientToUserInput, UserInputMutation };
  Kind kind;
  std::string target;  // the buffer, parameter or user input it refers to, where it refers to one
};

// A tensor of the program's state: in the archive (read on demand, its CRC-32 checked on every read)
// or in memory.
class StateTensor {
 public:
  StateTensor() = default;
  explicit StateTensor(at::Tensor t);
  // A tensor whose storage is the whole `record` of `archive` (`storage_elements` elements of
  // meta.dtype), viewed with meta's sizes and strides from `storage_offset`. The reader has checked
  // that the view lies within the storage.
  StateTensor(std::shared_ptr<const io::ZipArchive> archive, const io::ZipEntry& record, int64_t storage_elements, TensorMeta meta,
              int64_t storage_offset);

  // The whole tensor (read once, then kept).
  const at::Tensor& tensor() const;
  // This rank's part of it under `placements` on `mesh` (Partial: the value on coordinate 0 of that
  // mesh dim, zeros elsewhere), reading only the bytes of that part (a StridedShard, which is a run per
  // block, reads the whole tensor). Not kept.
  at::Tensor shard(const DeviceMesh& mesh, const Placements& placements) const;
  const TensorMeta& meta() const;
  // Whether `other` is this very tensor: the same bytes of the same archive record with the same view
  // (tied weights: torch.export saves one record under both names), or the same tensor in memory.
  bool same_tensor(const StateTensor& other) const;

 private:
  mutable at::Tensor tensor_;
  std::shared_ptr<const io::ZipArchive> archive_;
  const io::ZipEntry* record_ = nullptr;  // owned by archive_
  int64_t storage_elements_ = 0, storage_offset_ = 0;
  TensorMeta meta_;
};

// What a per-rank program's strategy choice costs, in the planner's units (bytes moved per rank plus a
// latency per collective), against choosing node by node as eager dispatch (and PyTorch) does.
struct StrategyCosts {
  double node_by_node = 0;
  double chosen = 0;
  std::string method;  // "greedy", "local search", "exact", "local search (exact search over budget)"
};

class Program {
 public:
  Graph graph;
  std::vector<InputSpec> inputs;    // one per graph input, in order
  std::vector<OutputSpec> outputs;  // one per graph output, in order
  std::map<std::string, StateTensor> state;  // by FQN
  std::string source;               // the archive it was read from

  // What the file holds besides the graph and signature, written back as read (JSON text).
  std::string module_call_graph = "[]", range_constraints = "{}", verifiers = "[]";
  int64_t schema_major = 8, schema_minor = 0;

  // A per-rank program's mesh (its local kernels and collectives run on it); null for a whole program.
  MeshPtr mesh;
  // What the transform that made a per-rank program found (annotations.h): every tensor value's
  // placements on the mesh, and why each node it inserted is there. Empty for a program as read.
  Annotations annotations;
  // The c10d process groups its collectives name, registered while the program lives.
  std::vector<std::shared_ptr<detail::RegisteredGroup>> process_groups;
  StrategyCosts strategy_costs;  // a per-rank program's

  std::vector<Value*> user_inputs() const;
  // The graph's text with the annotations: placements after shapes, notes after module paths.
  std::string str() const { return graph.str(&annotations); }
};

// Reads a .pt2 archive written by torch.export.save (torch 2.15, schema 8.x), in the training or the
// core-ATen IR, static or dynamic shapes. Anything it does not support raises DTensorError naming the
// file, the node and the field.
Program load_program(const std::string& path);

struct SaveProgramOptions {
  // The user inputs (tensors or integers, in order, as run() takes them) to record as the program's
  // example inputs: torch.export.load returns them as ep.example_inputs, which AOTInductor compiles
  // against (scripts/compile_rank_programs.py). Empty: an empty record, as torch.export.save writes
  // without them.
  std::vector<c10::IValue> sample_inputs;
};

// Writes `program` as a .pt2 archive torch.export.load accepts (under a temporary name, then renamed).
// A per-rank program also records which rank of which mesh it is and the process groups its
// collectives name (extra/dtensor.json), which compiling it carries into the package.
void save_program(const Program& program, const std::string& path, const SaveProgramOptions& options = {});

struct RunOptions {
  bool free_after_last_use = true;  // drop each value right after its last use
};

struct RunStats {
  int64_t peak_live_bytes = 0;  // the most tensor bytes the run held at once (state excluded)
};

// Runs the program on `user_inputs` (tensors or integers, in order) through the ATen dispatcher and
// returns the user outputs (LossOutput and gradients included, in output order; buffer mutations
// are applied to the state instead).
std::vector<c10::IValue> run(Program& program, const std::vector<c10::IValue>& user_inputs,
                             const RunOptions& options = {}, RunStats* stats = nullptr);

}  // namespace dtensor::graph
