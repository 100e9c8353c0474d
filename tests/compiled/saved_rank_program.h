#pragma once
// A per-rank program as the graph tests saved it (tests/dist/graph/expect_saves.h: tp_<name>_rank<r>.pt2
// with its sample inputs, and tp_<name>_rank<r>.expected.pt, what dtensor's interpreter computed from
// them), next to its AOTInductor package (scripts/compile_rank_programs.py). Read by the compiled
// programs' check (compiled_program_job saved, ctest compiled_hf_programs) and by the graph bench's
// compiled rows of the Hugging Face models (dtensor_graph_bench --saved), so that both hold the package
// to the same programs and the same outputs.

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <dtensor/dtensor.h>
#include <dtensor/graph/compiled_program.h>
#include <dtensor/graph/program.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtensor::testing {

struct SavedRankProgram {
  std::string name;                        // <name> of tp_<name>_rank<r>.pt2
  MeshPtr mesh;                            // the mesh it records (extra/dtensor.json)
  std::unique_ptr<graph::CompiledProgram> compiled;  // its package; registers the mesh's process groups
  graph::Program program;                  // the saved program, read back for the interpreter
  std::vector<at::Tensor> inputs;          // its sample inputs
  std::vector<at::Tensor> expected;        // the interpreter's outputs when it was saved
};

namespace saved_detail {

inline std::vector<char> record_of(caffe2::serialize::PyTorchStreamReader& archive, const std::string& name) {
  auto [data, size] = archive.getRecord(name);
  const char* bytes = static_cast<const char*>(data.get());
  return std::vector<char>(bytes, bytes + size);
}

inline std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  for (const c10::IValue& item : v.toTupleRef().elements()) out.push_back(item.toTensor());
  return out;
}

}  // namespace saved_detail

// This rank's tp_<name>_rank<r>.pt2 of `saved_dir` with its package of the same name in `compiled_dir`,
// on the mesh the program records (made on `world`: every rank must load the same names in the same order).
inline SavedRankProgram load_saved_rank_program(const std::shared_ptr<World>& world, const std::string& saved_dir,
                                                const std::string& compiled_dir, const std::string& name) {
  const std::string file = "tp_" + name + "_rank" + std::to_string(world->rank());
  const std::string path = saved_dir + "/" + file + ".pt2";
  SavedRankProgram saved;
  saved.name = name;
  caffe2::serialize::PyTorchStreamReader archive(path);
  const auto record = nlohmann::json::parse(saved_detail::record_of(archive, "extra/dtensor.json"));
  const auto& mesh = record.at("mesh");
  saved.mesh = DeviceMesh::create(world, mesh.at("shape").get<Shape>(), mesh.at("ranks").get<std::vector<int64_t>>(),
                                  {.dim_names = mesh.at("dim_names").get<std::vector<std::string>>()});
  // torch.save's (tuple(inputs), {}) (graph/sample_inputs.h)
  saved.inputs = saved_detail::tensors_of(torch::jit::pickle_load(saved_detail::record_of(archive, "data/sample_inputs/model.pt")).toTupleRef().elements()[0]);
  std::ifstream in(saved_dir + "/" + file + ".expected.pt", std::ios::binary);
  const std::vector<char> expected((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (expected.empty()) throw std::runtime_error(saved_dir + "/" + file + ".expected.pt: missing or empty");
  saved.expected = saved_detail::tensors_of(torch::jit::pickle_load(expected));
  // The package first: the program read back names the same process groups, which it registers.
  saved.compiled = std::make_unique<graph::CompiledProgram>(compiled_dir + "/" + file + ".pt2", saved.mesh);
  saved.program = graph::load_program(path);
  return saved;
}

inline std::vector<at::Tensor> interpret(SavedRankProgram& saved) {
  std::vector<c10::IValue> inputs(saved.inputs.begin(), saved.inputs.end());
  std::vector<at::Tensor> out;
  for (const c10::IValue& v : graph::run(saved.program, inputs)) out.push_back(v.toTensor());
  return out;
}

// Throws naming the program, `by` and the first output that differs from what the interpreter computed
// when the program was saved (rtol 1e-4, atol 1e-5: Inductor's fused kernels sum in another order).
inline void expect_equal_to_saved(const SavedRankProgram& saved, const std::vector<at::Tensor>& outputs, const std::string& by) {
  if (outputs.size() != saved.expected.size())
    throw std::runtime_error(saved.name + ": " + by + " gives " + std::to_string(outputs.size()) + " outputs, the interpreter gave " +
                             std::to_string(saved.expected.size()));
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].sizes() != saved.expected[i].sizes() || !at::allclose(outputs[i], saved.expected[i], 1e-4, 1e-5))
      throw std::runtime_error(saved.name + ": output " + std::to_string(i) + " by " + by + " differs from the interpreter's (max abs diff " +
                               (outputs[i].sizes() == saved.expected[i].sizes()
                                    ? std::to_string((outputs[i] - saved.expected[i]).abs().max().item<double>())
                                    : std::string("sizes differ")) +
                               ")");
}

}  // namespace dtensor::testing
