#pragma once
// The exported models the graph tests run (written at build time by scripts/export_test_models.py
// with the project venv's torch 2.15) and their reference tensors (PyTorch's own outputs).

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace dtensor::graph {
class Program;
}

namespace dtensor::testing {

// The collectives (waits not counted) of a program, by op name ("_c10d_functional::all_reduce").
std::map<std::string, int> collectives_in(const graph::Program& program);

constexpr int64_t kGptLayers = 2;  // scripts/export_test_models.py's GPT

// The test GPT's collectives per forward under module-level TP with a column-parallel lm_head: 1
// all-reduce for the vocabulary-parallel embedding and 1 per row-parallel layer (attn.wo, mlp.fc2),
// and the gather of the logits (a Replicate output).
std::map<std::string, int> gpt_module_level_collectives();

// The Hugging Face families scripts/export_hf_models.py exports ("hf/NAME_train_ir.pt2", ...).
inline const std::vector<std::string>& hugging_face_families() {
  static const std::vector<std::string> families = {"llama", "mistral", "qwen2", "mixtral", "qwen3_moe", "gpt2"};
  return families;
}

// The directory holding the archives and reference sets.
std::string graph_models_dir();
std::string graph_model(const std::string& archive);  // graph_models_dir() + "/" + archive
// Where a test writes files that a later ctest reads in PyTorch: `build_dir`, or a directory of the same
// name under $DTENSOR_TEST_OUTPUTS when set. distributed_gloo sets it, so that its copies do not
// overwrite those of distributed, which the readers check, while both run at once.
std::filesystem::path test_output_dir(const std::filesystem::path& build_dir);
// Where tests save programs for scripts/check_saved_programs.py to load in PyTorch (created on use).
std::string graph_saved(const std::string& archive);

// A text file of the models' directory ("hf/llama_tp_plan.json").
std::string graph_model_text(const std::string& name);
// A reference set (NAME.json + NAME.bin), in file order.
std::vector<std::pair<std::string, at::Tensor>> load_tensor_set(const std::string& name);
// The same, by name.
std::map<std::string, at::Tensor> tensor_map(const std::string& name);

}  // namespace dtensor::testing
