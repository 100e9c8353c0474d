#include "../io/untrusted_json.h"

#include "dtensor/graph/compiled_program.h"

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "dtensor/errors.h"
#include "dtensor/graph/program.h"
#include "dtensor/world.h"
#include "process_groups.h"

namespace dtensor::graph {
namespace {

template <typename T>
std::string list_text(const std::vector<T>& items, const char* separator = ", ") {
  std::ostringstream out;
  for (size_t i = 0; i < items.size(); ++i) out << (i ? separator : "") << items[i];
  return out.str();
}

// The flags of /proc/cpuinfo's first processor, as scripts/compile_rank_programs.py reads them.
std::set<std::string> this_cpu_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("flags", 0) == 0 && line.find(':') != std::string::npos) {
      std::istringstream words(line.substr(line.find(':') + 1));
      return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    }
  return {};
}

std::string mesh_text(const std::vector<int64_t>& shape, const std::vector<int64_t>& ranks, const std::vector<std::string>& names) {
  return "shape [" + list_text(shape) + "], ranks [" + list_text(ranks) + "]" +
         (names.empty() ? std::string() : ", dims [" + list_text(names) + "]");
}

// Whether `node` reads its tensor arguments' values, not only their sizes and dtype (a Partial bias's
// zeros_like on the ranks that do not add it): Inductor drops a state tensor read only that way.
bool reads_values(const Node* node) {
  if (node->is_output()) return false;  // returned as it is: the package does not compute with it
  static const std::set<std::string> metadata_only = {"aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::full_like",
                                                      "aten::new_zeros",  "aten::new_ones",  "aten::new_empty",  "aten::new_full"};
  return !metadata_only.count(node->op_name().substr(0, node->op_name().find('.')));
}

// The package's record against where it is loaded: this rank, this mesh, this thread count, a CPU with
// every extension the compiling one had.
void check_built_for(const io::JsonField& record, const DeviceMesh& mesh, const std::string& where) {
  const int64_t rank = mesh.world()->rank();
  const int64_t built_rank = record.at("rank").as_int(0);
  if (built_rank != rank)
    throw DTensorError(where + ": compiled for rank " + std::to_string(built_rank) + ", but this is rank " + std::to_string(rank) +
                       "; give each rank the package compiled from its own program");

  const io::JsonField built_mesh = record.at("mesh");
  const std::vector<int64_t> shape = built_mesh.at("shape").as_ints(1), ranks = built_mesh.at("ranks").as_ints(0);
  std::vector<std::string> names;
  for (const io::JsonField& name : built_mesh.at("dim_names").elements()) names.push_back(name.as_string());
  if (shape != mesh.shape() || ranks != mesh.ranks() || names != mesh.dim_names())
    throw DTensorError(where + ": compiled for a mesh of " + mesh_text(shape, ranks, names) + ", but it was given " +
                       mesh_text(mesh.shape(), mesh.ranks(), mesh.dim_names()) +
                       "; run it on the mesh it was compiled for, or compile the program made on this one");

  const int64_t threads = record.at("threads").as_int(1);
  if (threads != at::get_num_threads())
    throw DTensorError(where + ": its kernels were compiled for " + std::to_string(threads) + " intra-op threads, but this process runs " +
                       std::to_string(at::get_num_threads()) + "; call at::set_num_threads(" + std::to_string(threads) +
                       ") before loading it, or compile with --threads " + std::to_string(at::get_num_threads()));

  const std::set<std::string> here = this_cpu_flags();
  std::vector<std::string> missing;
  for (const io::JsonField& flag : record.at("cpu_flags").elements())
    if (!here.count(flag.as_string())) missing.push_back(flag.as_string());
  if (!missing.empty())
    throw DTensorError(where + ": compiled on a machine whose CPU has instruction set extensions this one lacks (" +
                       list_text(missing) + "; its kernels are built with -march=native); compile it on this machine");
}

}  // namespace

CompiledProgram::CompiledProgram(const std::string& package_path, MeshPtr mesh) : path_(package_path), mesh_(std::move(mesh)) {
  const std::string where = "compiled program " + path_;
  if (!mesh_ || !mesh_->contains_this_rank()) throw DTensorError(where + ": give the mesh it was compiled for, holding this rank");
  std::unordered_map<std::string, std::string> metadata;
  try {
    metadata = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path_, "model");
  } catch (const std::exception& e) {
    const std::string why = e.what();
    throw DTensorError(where + ": not an AOTInductor package this LibTorch reads (" + why.substr(0, why.find('\n')) + ")");
  }
  const auto record_text = metadata.find("dtensor");
  if (record_text == metadata.end())
    throw DTensorError(where + ": it records no dtensor metadata; compile per-rank programs with scripts/compile_rank_programs.py");
  const std::string source = where + ": metadata 'dtensor'";
  const io::Json parsed = io::parse_untrusted_json(record_text->second, source);
  const io::JsonField record(parsed, source);

  check_built_for(record, *mesh_, where);

  for (const io::JsonField& input : record.at("inputs").elements()) {
    InputRecord expected{input.at("dtype").as_string(), input.at("shape").as_ints(-1)};
    if (expected.dtype == "SymInt") input.fail("a symbolic integer input: compiled programs take tensor inputs only");
    inputs_.push_back(std::move(expected));
  }

  // The groups its collectives call by name must be this mesh's: a package compiled on another backend
  // (or by a dtensor naming groups differently) would otherwise fail inside its first collective.
  std::vector<std::string> ours;
  for (int64_t d = 0; d < mesh_->ndim(); ++d) {
    groups_.push_back(detail::group_for(*mesh_, d));
    ours.push_back(groups_.back()->name());
  }
  for (const io::JsonField& group : record.at("process_groups").elements())
    if (std::find(ours.begin(), ours.end(), group.as_string()) == ours.end())
      throw DTensorError(where + ": its collectives call process group '" + group.as_string() +
                         "', which this process does not have (this mesh's groups, on " +
                         std::string(mesh_->backend_description().backend.name()) + ": " + list_text(ours) + "; it was compiled on " +
                         record.at("mesh").at("backend").as_string() + "); run it on the backend it was compiled for, or recompile");

  try {
    loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path_, "model", /*run_single_threaded=*/true);
  } catch (const std::exception& e) {
    throw DTensorError(where + ": AOTInductor could not load it: " + std::string(e.what()).substr(0, 500));
  }
}

CompiledProgram::~CompiledProgram() = default;

void CompiledProgram::use_state_of(Program& program) {
  const std::string where = "compiled program " + path_;
  const auto compiled_in = loader_->get_runner()->extract_constants_map(/*use_inactive=*/false);
  std::unordered_map<std::string, at::Tensor> state;
  for (const auto& [name, own] : compiled_in) {
    const auto found = program.state.find(name);
    if (found == program.state.end())
      throw DTensorError(where + ": it computes with '" + name + "', which " + program.source + " has no state tensor for; give the program it was compiled from");
    const at::Tensor& tensor = found->second.tensor();
    if (tensor.scalar_type() != own.scalar_type() || tensor.sizes() != own.sizes() || tensor.strides() != own.strides() || !tensor.device().is_cpu())
      throw DTensorError(where + ": state tensor '" + name + "' is " + std::string(c10::toString(tensor.scalar_type())) + " " +
                         shape_str(tensor.sizes().vec()) + " strides " + shape_str(tensor.strides().vec()) + "; it was compiled for " +
                         c10::toString(own.scalar_type()) + " " + shape_str(own.sizes().vec()) + " strides " + shape_str(own.strides().vec()));
    state.emplace(name, tensor);
  }
  // A parameter or buffer Inductor wrote into the code as literal values (it inlines small tensors
  // unless told not to) would silently keep its compiled value when the optimizer steps it.
  for (const InputSpec& spec : program.inputs)
    if ((spec.kind == InputSpec::Kind::Parameter || spec.kind == InputSpec::Kind::Buffer) && !compiled_in.count(spec.target) &&
        std::any_of(spec.value->uses().begin(), spec.value->uses().end(), reads_values))
      throw DTensorError(where + ": '" + spec.target + "' is compiled into its code as values, so updates to it could not reach it; compile "
                         "with scripts/compile_rank_programs.py, which keeps every state tensor a constant the package reads");
  loader_->load_constants(state, /*use_inactive=*/false, /*check_full_update=*/true, /*user_managed=*/true);
}

std::vector<at::Tensor> CompiledProgram::run(const std::vector<at::Tensor>& user_inputs) {
  const std::string where = "compiled program " + path_;
  if (user_inputs.size() != inputs_.size())
    throw DTensorError(where + ": it takes " + std::to_string(inputs_.size()) + " user inputs, got " + std::to_string(user_inputs.size()));
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < user_inputs.size(); ++i) {
    const at::Tensor& t = user_inputs[i];
    const InputRecord& expected = inputs_[i];
    bool fits = t.defined() && t.device().is_cpu() && c10::toString(t.scalar_type()) == expected.dtype &&
                t.dim() == static_cast<int64_t>(expected.shape.size());
    for (size_t d = 0; fits && d < expected.shape.size(); ++d)
      fits = expected.shape[d] == -1 || t.size(static_cast<int64_t>(d)) == expected.shape[d];
    if (!fits)
      throw DTensorError(where + ": input " + std::to_string(i) + " is " +
                         (t.defined() ? std::string(c10::toString(t.scalar_type())) + " " + shape_str(t.sizes().vec()) + " on " + t.device().str()
                                      : std::string("undefined")) +
                         "; it was compiled for " + expected.dtype + " " + shape_str(expected.shape) + " (-1: any size) on the CPU");
    inputs.push_back(t.contiguous());
  }
  try {
    return loader_->run(inputs);
  } catch (const c10::Error& e) {
    throw DTensorError(where + ": " + e.what_without_backtrace());
  }
}

}  // namespace dtensor::graph
