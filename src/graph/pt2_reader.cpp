// Reads torch.export's .pt2 archives (torch 2.15: schema 8.x). The archive is untrusted: io::ZipArchive
// validates its directory and checks CRC-32s, JSON records are parsed with limits and read through
// io::JsonField (the graph itself in pt2_graph_reader.cpp), and every weight's view must lie within
// its record. Weights stay in the archive (StateTensor reads them on demand).

#include <algorithm>

#include "../io/checked_int.h"
#include "../io/untrusted_json.h"
#include "../io/zip_archive.h"
#include "dtensor/errors.h"
#include "dtensor/graph/program.h"
#include "pt2_graph_reader.h"

namespace dtensor::graph {
namespace {

using io::JsonField;

// JSON records are small next to the weights (a 32-layer model's model.json is a few MiB).
constexpr int64_t kMaxJsonRecordBytes = int64_t{1} << 30;

std::shared_ptr<const io::ZipArchive> open_archive(const std::string& path) {
  try {
    return std::make_shared<const io::ZipArchive>(path);
  } catch (const DTensorError& e) {
    const std::string what = e.what();
    throw DTensorError(path + ": not a readable .pt2 archive (torch.export.save writes one; the file may be missing, truncated "
                              "or not a zip): " + what.substr(std::string("dtensor: ").size()));
  }
}

const io::ZipEntry& record(const io::ZipArchive& archive, const std::string& name) {
  const io::ZipEntry* entry = archive.find(name);
  if (!entry) throw DTensorError(archive.path() + ": the archive has no record " + name);
  return *entry;
}

io::Json record_json(const io::ZipArchive& archive, const std::string& name) {
  return io::parse_untrusted_json(archive.read_text(record(archive, name), kMaxJsonRecordBytes), archive.path() + ": " + name);
}

// A JSON value kept as text to write back (module_call_graph, ...): bounded by the parse's depth limit.
std::string text_of(const JsonField& parent, const std::string& key, const char* absent) {
  const auto field = parent.find(key);
  return field ? field->json().dump() : absent;
}

// ---- the state: weights and constants -----------------------------------------------------------------

// One entry of model_weights_config.json / model_constants_config.json: the tensor's meta, and its
// storage (the record `path_name`), which the view must fit.
StateTensor state_tensor(const std::shared_ptr<const io::ZipArchive>& archive, const std::string& dir, const JsonField& entry) {
  if (const auto pickled = entry.find("use_pickle"); pickled && pickled->as_bool())
    entry.fail("pickled tensors (tensor subclasses) are not supported");
  const JsonField path_name = entry.at("path_name");
  const std::string& file = path_name.as_string();
  if (file.empty() || file.find('/') != std::string::npos) path_name.fail("'" + file.substr(0, 80) + "' is not a record name");
  const io::ZipEntry* stored = archive->find(dir + file);
  if (!stored) path_name.fail("the weight record " + dir + file + " is missing from the archive");
  Value meta;
  detail::read_tensor_meta(entry.at("tensor_meta"), meta);
  const int64_t element = static_cast<int64_t>(c10::elementSize(meta.meta.dtype));
  if (stored->size % element != 0)
    path_name.fail("the record " + dir + file + " holds " + std::to_string(stored->size) + " bytes, not a whole number of " +
                   c10::toString(meta.meta.dtype) + " elements");
  const int64_t storage_elements = stored->size / element;
  const int64_t needed = *io::checked_add(*io::checked_extent(meta.meta.shape, meta.meta.stride), meta.storage_offset);
  if (needed > storage_elements)
    entry.at("tensor_meta").fail("its view needs " + std::to_string(needed) + " elements of storage, but the record " + dir + file +
                                 " holds " + std::to_string(storage_elements));
  return StateTensor(archive, *stored, storage_elements, meta.meta, meta.storage_offset);
}

void read_state(const std::shared_ptr<const io::ZipArchive>& archive, const std::string& dir, const std::string& config_name,
                Program& program) {
  const io::Json config = record_json(*archive, dir + config_name);
  const std::string where = archive->path() + ": " + dir + config_name;
  for (const auto& [fqn, entry] : JsonField(config, where).at("config").members()) {
    if (program.state.count(fqn)) entry.fail("'" + fqn + "' is both a weight and a constant");
    program.state.emplace(fqn, state_tensor(archive, dir, entry));
  }
}

// ---- the signature ------------------------------------------------------------------------------------------

Value* graph_input_named(const JsonField& name, Graph& graph) {
  Value* value = graph.find_value(name.as_string());
  if (!value || value->producer) name.fail("no graph input named '" + name.as_string() + "'");
  return value;
}

InputSpec input_spec(const JsonField& spec, Graph& graph) {
  const auto [kind, v] = spec.only_member();
  auto named = [&](const JsonField& arg) { return graph_input_named(arg.at("name"), graph); };
  if (kind == "parameter") return {InputSpec::Kind::Parameter, named(v.at("arg")), v.at("parameter_name").as_string()};
  if (kind == "buffer") {
    const auto persistent = v.find("persistent");
    return {InputSpec::Kind::Buffer, named(v.at("arg")), v.at("buffer_name").as_string(), !persistent || persistent->as_bool()};
  }
  if (kind == "tensor_constant")
    return {InputSpec::Kind::TensorConstant, named(v.at("arg")), v.at("tensor_constant_name").as_string()};
  if (kind == "user_input") {
    const auto [k, a] = v.at("arg").only_member();
    if (k != "as_tensor" && k != "as_sym_int") a.fail("unsupported user input kind '" + k + "'");
    return {InputSpec::Kind::UserInput, graph_input_named(k == "as_tensor" ? a.at("name") : a.at("as_name"), graph), ""};
  }
  spec.fail("unsupported input kind '" + kind + "'");
}

OutputSpec output_spec(const JsonField& spec) {
  const auto [kind, v] = spec.only_member();
  if (kind == "user_output") return {OutputSpec::Kind::UserOutput, ""};
  if (kind == "buffer_mutation") return {OutputSpec::Kind::BufferMutation, v.at("buffer_name").as_string()};
  if (kind == "loss_output") return {OutputSpec::Kind::LossOutput, ""};
  if (kind == "gradient_to_parameter") return {OutputSpec::Kind::GradientToParameter, v.at("parameter_name").as_string()};
  if (kind == "gradient_to_user_input") return {OutputSpec::Kind::GradientToUserInput, v.at("user_input_name").as_string()};
  if (kind == "user_input_mutation") return {OutputSpec::Kind::UserInputMutation, v.at("user_input_name").as_string()};
  spec.fail("unsupported output kind '" + kind + "'");
}

// An output that mutates a buffer or is a gradient names a buffer, parameter or user input of the
// program, and a buffer's new value is a tensor.
void check_output_targets(const JsonField& specs, const Program& program) {
  for (size_t k = 0; k < program.outputs.size(); ++k) {
    const OutputSpec& out = program.outputs[k];
    std::optional<InputSpec::Kind> wanted;
    if (out.kind == OutputSpec::Kind::BufferMutation) wanted = InputSpec::Kind::Buffer;
    if (out.kind == OutputSpec::Kind::GradientToParameter) wanted = InputSpec::Kind::Parameter;
    if (out.kind == OutputSpec::Kind::GradientToUserInput || out.kind == OutputSpec::Kind::UserInputMutation)
      wanted = InputSpec::Kind::UserInput;
    if (!wanted) continue;
    const bool found = std::any_of(program.inputs.begin(), program.inputs.end(), [&](const InputSpec& in) {
      return in.kind == *wanted && (in.kind == InputSpec::Kind::UserInput ? in.value->name : in.target) == out.target;
    });
    const Arg& value = program.graph.outputs()[k];
    if (!found || (out.kind == OutputSpec::Kind::BufferMutation && value.kind != Arg::Kind::Tensor))
      specs.fail("output spec " + std::to_string(k) + " names '" + out.target + "', which is not a " +
                 (*wanted == InputSpec::Kind::Buffer ? "buffer" : *wanted == InputSpec::Kind::Parameter ? "parameter" : "user input") +
                 " of the program" + (found ? " (or its output is not a tensor)" : ""));
  }
}

void read_signature(const JsonField& signature, Program& program) {
  for (const JsonField& spec : signature.at("input_specs").elements()) program.inputs.push_back(input_spec(spec, program.graph));
  for (const JsonField& spec : signature.at("output_specs").elements()) program.outputs.push_back(output_spec(spec));
  if (program.inputs.size() != program.graph.inputs().size() || program.outputs.size() != program.graph.outputs().size())
    signature.fail("the signature does not match the graph's inputs and outputs");
  for (size_t i = 0; i < program.inputs.size(); ++i)
    if (program.inputs[i].value != program.graph.inputs()[i])
      signature.at("input_specs").fail("input spec " + std::to_string(i) + " names '" + program.inputs[i].value->name +
                                       "', not graph input " + std::to_string(i) + " ('" + program.graph.inputs()[i]->name + "')");
  check_output_targets(signature.at("output_specs"), program);
}

// Every parameter, buffer and constant has its tensor, and the graph input it feeds has that tensor's
// dtype and shape (the transforms plan with the graph's metas, the interpreter runs the tensors).
void check_state_feeds_graph(const std::string& where, const Program& program) {
  for (const InputSpec& spec : program.inputs) {
    if (spec.kind == InputSpec::Kind::UserInput) continue;
    const auto it = program.state.find(spec.target);
    if (it == program.state.end())
      throw DTensorError(where + ": '" + spec.target + "' has no tensor in the archive's weights or constants");
    const TensorMeta& stored = it->second.meta();
    if (!spec.value->is_tensor() || stored.shape != spec.value->meta.shape || stored.dtype != spec.value->meta.dtype)
      throw DTensorError(where + ": '" + spec.target + "' is stored as " + c10::toString(stored.dtype) + " " + shape_str(stored.shape) +
                         " but the graph input %" + spec.value->name + " it feeds is " + c10::toString(spec.value->meta.dtype) +
                         " " + shape_str(spec.value->meta.shape));
  }
}

}  // namespace

Program load_program(const std::string& path) {
  const auto archive = open_archive(path);
  if (const io::ZipEntry* format = archive->find("archive_format"); format && archive->read_text(*format, 64) != "pt2")
    throw DTensorError(path + ": archive_format: not a pt2 archive");
  if (const io::ZipEntry* order = archive->find("byteorder"); order && archive->read_text(*order, 64) != "little")
    throw DTensorError(path + ": byteorder: the weights are not little-endian, which this machine is");
  const io::Json model_json = record_json(*archive, "models/model.json");
  const std::string where = path + ": models/model.json";
  const JsonField model(model_json, where);
  Program program;
  program.source = path;
  const JsonField version = model.at("schema_version");
  program.schema_major = version.at("major").as_int();
  program.schema_minor = version.at("minor").as_int();
  if (program.schema_major != 8)
    version.fail("schema version " + std::to_string(program.schema_major) + "." + std::to_string(program.schema_minor) +
                 " is not supported (dtensor reads 8.x, torch 2.15's)");
  program.range_constraints = text_of(model, "range_constraints", "{}");
  program.verifiers = text_of(model, "verifiers", "[]");
  const JsonField module = model.at("graph_module");
  program.module_call_graph = text_of(module, "module_call_graph", "[]");
  detail::read_graph(module.at("graph"), program);
  read_signature(module.at("signature"), program);

  read_state(archive, "data/weights/", "model_weights_config.json", program);
  read_state(archive, "data/constants/", "model_constants_config.json", program);
  check_state_feeds_graph(path, program);
  return program;
}

}  // namespace dtensor::graph
