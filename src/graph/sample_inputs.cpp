#include "sample_inputs.h"

#include "../io/json.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <ATen/ATen.h>

#include "dtensor/errors.h"
#include "dtensor/graph/program.h"
#include "dtensor/world.h"
#include "process_groups.h"

namespace dtensor::graph::detail {
namespace {

// The sample's tensor must be what the graph input describes: same dtype and rank, and the same size
// wherever the size is static (a dynamic dim takes any size, as when the program runs).
void check_sample(const Value& input, const c10::IValue& sample, size_t index) {
  const std::string which = "sample input " + std::to_string(index) + " ('" + input.name + "')";
  if (!input.is_tensor()) {
    if (!sample.isInt()) throw DTensorError(which + ": the program takes a symbolic integer here; give an integer");
    return;
  }
  if (!sample.isTensor()) throw DTensorError(which + ": the program takes a tensor here, got " + sample.tagKind());
  const at::Tensor& t = sample.toTensor();
  const TensorMeta& meta = input.meta;
  bool fits = t.scalar_type() == meta.dtype && t.dim() == static_cast<int64_t>(meta.shape.size());
  for (size_t d = 0; fits && d < meta.shape.size(); ++d) {
    const bool dynamic = d < input.symbolic_sizes.size() && !input.symbolic_sizes[d].empty();
    fits = dynamic || t.size(static_cast<int64_t>(d)) == meta.shape[d];
  }
  if (!fits)
    throw DTensorError(which + " is " + std::string(c10::toString(t.scalar_type())) + " " + shape_str(t.sizes().vec()) +
                       "; the program takes " + c10::toString(meta.dtype) + " " + shape_str(meta.shape) +
                       " (pass this rank's local input)");
}

}  // namespace

std::string sample_inputs_archive(const Program& program, const std::vector<c10::IValue>& inputs) {
  const std::vector<Value*> expected = program.user_inputs();
  if (inputs.size() != expected.size())
    throw DTensorError("sample inputs: the program takes " + std::to_string(expected.size()) + " user inputs, got " +
                       std::to_string(inputs.size()));
  std::vector<c10::IValue> args;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_sample(*expected[i], inputs[i], i);
    args.push_back(inputs[i].isTensor() ? c10::IValue(inputs[i].toTensor().contiguous()) : inputs[i]);
  }
  const c10::IValue args_and_kwargs = c10::ivalue::Tuple::create(
      {c10::ivalue::Tuple::create(std::move(args)), c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get())});

  std::vector<char> pickle;
  // Untagged aggregates: a tagged dict is rebuilt through torch.jit._pickle, which a weights-only load refuses.
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle.insert(pickle.end(), data, data + n); }, nullptr,
                              nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(args_and_kwargs);
  pickler.stop();
  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    archive.append(static_cast<const char*>(data), n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

std::string rank_program_record(const Program& program) {
  const DeviceMesh& mesh = *program.mesh;
  std::vector<std::string> groups;
  for (const auto& g : program.process_groups) groups.push_back(g->name());
  nlohmann::json inputs = nlohmann::json::array();
  for (const Value* input : program.user_inputs()) {
    if (!input->is_tensor()) {
      inputs.push_back({{"dtype", "SymInt"}, {"shape", nlohmann::json::array()}});
      continue;
    }
    std::vector<int64_t> shape = input->meta.shape;
    for (size_t d = 0; d < shape.size(); ++d)
      if (d < input->symbolic_sizes.size() && !input->symbolic_sizes[d].empty()) shape[d] = -1;
    inputs.push_back({{"dtype", c10::toString(input->meta.dtype)}, {"shape", shape}});
  }
  const nlohmann::json record = {
      {"rank", mesh.world()->rank()},
      {"mesh",
       {{"shape", mesh.shape()},
        {"ranks", mesh.ranks()},
        {"dim_names", mesh.dim_names()},
        {"backend", std::string(mesh.backend_description().backend.name())}}},
      {"process_groups", groups},
      {"inputs", inputs}};
  return record.dump();
}

}  // namespace dtensor::graph::detail
