#include "test_models.h"

#include "build_paths.h"
#include "dtensor/graph/program.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dtensor::testing {
namespace {

at::ScalarType dtype_named(const std::string& name) {
  static const std::map<std::string, at::ScalarType> types = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},    {"int32", at::kInt},      {"int16", at::kShort},  {"int8", at::kChar},
      {"uint8", at::kByte},    {"bool", at::kBool}};
  return types.at(name);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path + " (the build exports the test models)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string graph_models_dir() { return build_paths::graph_models; }
std::string graph_model(const std::string& archive) { return graph_models_dir() + "/" + archive; }
std::string graph_model_text(const std::string& name) { return read_file(graph_model(name)); }
std::filesystem::path test_output_dir(const std::filesystem::path& build_dir) {
  const char* outputs = std::getenv("DTENSOR_TEST_OUTPUTS");
  return outputs != nullptr && *outputs != '\0' ? std::filesystem::path(outputs) / build_dir.filename() : build_dir;
}
std::string graph_saved(const std::string& archive) {
  const std::filesystem::path dir = test_output_dir(build_paths::graph_saved);
  std::filesystem::create_directories(dir);
  return (dir / archive).string();
}

std::vector<std::pair<std::string, at::Tensor>> load_tensor_set(const std::string& name) {
  const auto index = nlohmann::json::parse(read_file(graph_models_dir() + "/" + name + ".json"));
  const std::string bytes = read_file(graph_models_dir() + "/" + name + ".bin");
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& t : index.at("tensors")) {
    at::Tensor tensor = at::empty(t.at("shape").get<std::vector<int64_t>>(), at::TensorOptions().dtype(dtype_named(t.at("dtype"))));
    std::memcpy(tensor.data_ptr(), bytes.data() + t.at("offset").get<size_t>(), t.at("nbytes").get<size_t>());
    out.emplace_back(t.at("name").get<std::string>(), tensor);
  }
  return out;
}

std::map<std::string, at::Tensor> tensor_map(const std::string& name) {
  std::map<std::string, at::Tensor> out;
  for (auto& [k, v] : load_tensor_set(name)) out[k] = v;
  return out;
}

std::map<std::string, int> collectives_in(const graph::Program& program) {
  std::map<std::string, int> out;
  for (const graph::Node* n : program.graph.nodes())
    if (n->target.find("_c10d_functional") != std::string::npos && n->op_name() != "_c10d_functional::wait_tensor") ++out[n->op_name()];
  return out;
}

std::map<std::string, int> gpt_module_level_collectives() {
  return {{"_c10d_functional::all_reduce", static_cast<int>(1 + 2 * kGptLayers)}, {"_c10d_functional::all_gather_into_tensor", 1}};
}

}  // namespace dtensor::testing
