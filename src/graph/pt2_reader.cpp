// Reads torch.export's .pt2 archives (torch 2.15: schema 8.x). The archive is untrusted: io::ZipArchive
// validates its directory and checks CRC-32s, JSON records are decoded in one strict pass into torch's
// generated serialization types (pt2_decoding.h), their meaning is checked (the graph itself in
// pt2_graph_reader.cpp), and every weight's view must lie within its record. Weights stay in the
// archive (StateTensor reads them on demand).

#include <algorithm>

#include "../io/checked_int.h"
#include "../io/json_pull.h"
#include "../io/zip_archive.h"
#include "dtensor/errors.h"
#include "dtensor/graph/program.h"
#include "pt2_graph_reader.h"

namespace dtensor::graph {
namespace {

using detail::RecordField;
using detail::RecordScope;
namespace ex = torch::_export;

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

std::string record_text(const io::ZipArchive& archive, const std::string& name) {
  return archive.read_text(record(archive, name), kMaxJsonRecordBytes);
}

// A JSON record, decoded as T.
template <class T>
T decoded_record(const std::string& text, const std::string& where) {
  T out;
  detail::decode_record(text, where, out);
  return out;
}

void check_schema_version(int64_t major, int64_t minor, const RecordField& model) {
  if (major != 8)
    (model / "schema_version")
        .fail("schema version " + std::to_string(major) + "." + std::to_string(minor) + " is not supported (dtensor reads 8.x, torch 2.15's)");
}

// The integer member `key` of the object at `object`, read apart from the decode (errors only).
std::optional<int64_t> stored_integer(const std::string& text, std::optional<size_t> object, std::string_view key) {
  const auto at = object ? io::json_member_offset(text, *object, key) : std::nullopt;
  if (!at) return std::nullopt;
  try {
    io::JsonPull in(text, io::kMaxJsonDepth, *at);
    if (in.peek() != io::JsonPull::Kind::Number) return std::nullopt;
    const io::JsonPull::Number n = in.read_number();
    return n.type == io::JsonPull::Number::Type::Signed ? std::optional(n.signed_value) : std::nullopt;
  } catch (const io::JsonPull::Problem&) {
    return std::nullopt;
  }
}

// models/model.json, decoded. A record another schema major wrote fails to decode somewhere inside
// its graph; its version is the better error.
ex::ExportedProgram decoded_model(const std::string& text, const RecordField& model, const std::string& where) {
  try {
    return decoded_record<ex::ExportedProgram>(text, where);
  } catch (const DTensorError&) {
    const auto version = io::json_member_offset(text, 0, "schema_version");
    if (const auto major = stored_integer(text, version, "major")) check_schema_version(*major, stored_integer(text, version, "minor").value_or(0), model);
    throw;
  }
}

// ---- the state: weights and constants -----------------------------------------------------------------

// One entry of model_weights_config.json / model_constants_config.json: the tensor's meta, and its
// storage (the record `path_name`), which the view must fit.
StateTensor state_tensor(const std::shared_ptr<const io::ZipArchive>& archive, const std::string& dir, const ex::PayloadMeta& entry,
                         const RecordField& field) {
  if (entry.get_use_pickle()) (field / "use_pickle").fail("pickled tensors (tensor subclasses) are not supported");
  const RecordField path_name = field / "path_name";
  const std::string& file = entry.get_path_name();
  if (file.empty() || file.find('/') != std::string::npos) path_name.fail("'" + file.substr(0, 80) + "' is not a record name");
  const io::ZipEntry* stored = archive->find(dir + file);
  if (!stored) path_name.fail("the weight record " + dir + file + " is missing from the archive");
  if (!entry.get_tensor_meta()) (field / "tensor_meta").fail("the member is missing");
  Value meta;
  detail::read_tensor_meta(*entry.get_tensor_meta(), field / "tensor_meta", meta);
  const int64_t element = static_cast<int64_t>(c10::elementSize(meta.meta.dtype));
  if (stored->size % element != 0)
    path_name.fail("the record " + dir + file + " holds " + std::to_string(stored->size) + " bytes, not a whole number of " +
                   c10::toString(meta.meta.dtype) + " elements");
  const int64_t storage_elements = stored->size / element;
  const int64_t needed = *io::checked_add(*io::checked_extent(meta.meta.shape, meta.meta.stride), meta.storage_offset);
  if (needed > storage_elements)
    (field / "tensor_meta")
        .fail("its view needs " + std::to_string(needed) + " elements of storage, but the record " + dir + file + " holds " +
              std::to_string(storage_elements));
  return StateTensor(archive, *stored, storage_elements, meta.meta, meta.storage_offset);
}

void read_state(const std::shared_ptr<const io::ZipArchive>& archive, const std::string& dir, const std::string& config_name,
                Program& program) {
  const std::string where = archive->path() + ": " + dir + config_name;
  const auto payload = decoded_record<ex::PayloadConfig>(record_text(*archive, dir + config_name), where);
  detail::RecordSteps steps;
  const RecordField config = RecordField(steps, where) / "config";
  for (const auto& [fqn, entry] : payload.get_config()) {
    const RecordScope scope(config);
    if (program.state.count(fqn)) (config / fqn).fail("'" + fqn.substr(0, 200) + "' is both a weight and a constant");
    program.state.emplace(fqn, state_tensor(archive, dir, entry, config / fqn));
  }
}

// ---- the signature ------------------------------------------------------------------------------------------

Value* graph_input_named(const std::string& name, const RecordField& field, Graph& graph) {
  Value* value = graph.find_value(name);
  if (!value || value->producer()) field.fail("no graph input named '" + name.substr(0, 200) + "'");
  return value;
}

InputSpec input_spec(const ex::InputSpec& spec, const RecordField& field, Graph& graph) {
  using Tag = ex::InputSpec::Tag;
  const RecordField at = field / detail::kind_name(ex::printEnum(spec.tag()));
  auto named = [&](const ex::TensorArgument& arg) { return graph_input_named(arg.get_name(), at / "arg" / "name", graph); };
  switch (spec.tag()) {
    case Tag::PARAMETER: return {InputSpec::Kind::Parameter, named(spec.get_parameter().get_arg()), spec.get_parameter().get_parameter_name()};
    case Tag::BUFFER: {
      return {InputSpec::Kind::Buffer, named(spec.get_buffer().get_arg()), spec.get_buffer().get_buffer_name(), spec.get_buffer().get_persistent()};
    }
    case Tag::TENSOR_CONSTANT:
      return {InputSpec::Kind::TensorConstant, named(spec.get_tensor_constant().get_arg()), spec.get_tensor_constant().get_tensor_constant_name()};
    case Tag::USER_INPUT: {
      const ex::Argument& arg = spec.get_user_input().get_arg();
      const RecordField arg_at = at / "arg";
      if (arg.tag() == ex::Argument::Tag::AS_TENSOR)
        return {InputSpec::Kind::UserInput, graph_input_named(arg.get_as_tensor().get_name(), arg_at / "as_tensor" / "name", graph), ""};
      if (arg.tag() == ex::Argument::Tag::AS_SYM_INT) {
        const ex::SymIntArgument& s = arg.get_as_sym_int();
        if (s.tag() == ex::SymIntArgument::Tag::AS_NAME)
          return {InputSpec::Kind::UserInput, graph_input_named(s.get_as_name(), arg_at / "as_sym_int" / "as_name", graph), ""};
      }
      arg_at.fail("unsupported user input kind '" + detail::kind_name(ex::printEnum(arg.tag())) + "'");
    }
    default: field.fail("unsupported input kind '" + detail::kind_name(ex::printEnum(spec.tag())) + "'");
  }
}

OutputSpec output_spec(const ex::OutputSpec& spec, const RecordField& field) {
  using Tag = ex::OutputSpec::Tag;
  switch (spec.tag()) {
    case Tag::USER_OUTPUT: return {OutputSpec::Kind::UserOutput, ""};
    case Tag::BUFFER_MUTATION: return {OutputSpec::Kind::BufferMutation, spec.get_buffer_mutation().get_buffer_name()};
    case Tag::LOSS_OUTPUT: return {OutputSpec::Kind::LossOutput, ""};
    case Tag::GRADIENT_TO_PARAMETER: return {OutputSpec::Kind::GradientToParameter, spec.get_gradient_to_parameter().get_parameter_name()};
    case Tag::GRADIENT_TO_USER_INPUT:
      return {OutputSpec::Kind::GradientToUserInput, spec.get_gradient_to_user_input().get_user_input_name()};
    case Tag::USER_INPUT_MUTATION: return {OutputSpec::Kind::UserInputMutation, spec.get_user_input_mutation().get_user_input_name()};
    default: field.fail("unsupported output kind '" + detail::kind_name(ex::printEnum(spec.tag())) + "'");
  }
}

// An output that mutates a buffer or is a gradient names a buffer, parameter or user input of the
// program, and a buffer's new value is a tensor.
void check_output_targets(const RecordField& specs, const Program& program) {
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
      specs.fail("output spec " + std::to_string(k) + " names '" + out.target.substr(0, 200) + "', which is not a " +
                 (*wanted == InputSpec::Kind::Buffer ? "buffer" : *wanted == InputSpec::Kind::Parameter ? "parameter" : "user input") +
                 " of the program" + (found ? " (or its output is not a tensor)" : ""));
  }
}

void read_signature(const ex::GraphSignature& signature, const RecordField& field, Program& program) {
  for (size_t i = 0; i < signature.get_input_specs().size(); ++i)
    program.inputs.push_back(input_spec(signature.get_input_specs()[i], field / "input_specs" / i, program.graph));
  for (size_t i = 0; i < signature.get_output_specs().size(); ++i)
    program.outputs.push_back(output_spec(signature.get_output_specs()[i], field / "output_specs" / i));
  if (program.inputs.size() != program.graph.inputs().size() || program.outputs.size() != program.graph.outputs().size())
    field.fail("the signature does not match the graph's inputs and outputs");
  for (size_t i = 0; i < program.inputs.size(); ++i)
    if (program.inputs[i].value != program.graph.inputs()[i])
      (field / "input_specs")
          .fail("input spec " + std::to_string(i) + " names '" + program.inputs[i].value->name + "', not graph input " + std::to_string(i) +
                " ('" + program.graph.inputs()[i]->name + "')");
  check_output_targets(field / "output_specs", program);
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

// A part of model.json dtensor keeps as text to write back (module_call_graph, range_constraints,
// verifiers): decoded all the same, so that what the writer decodes later is known good, and written
// again by torch's to_json (which, as torch's own C++ writer, spells a -inf there "Infinity"; the
// writer respells those of nodes only).
template <class T>
std::string kept_as_text(const T& decoded) {
  return nlohmann::json(decoded).dump();
}

}  // namespace

Program load_program(const std::string& path) {
  const auto archive = open_archive(path);
  if (const io::ZipEntry* format = archive->find("archive_format"); format && archive->read_text(*format, 64) != "pt2")
    throw DTensorError(path + ": archive_format: not a pt2 archive");
  if (const io::ZipEntry* order = archive->find("byteorder"); order && archive->read_text(*order, 64) != "little")
    throw DTensorError(path + ": byteorder: the weights are not little-endian, which this machine is");
  const std::string where = path + ": models/model.json";
  detail::RecordSteps steps;
  const RecordField model(steps, where);
  const auto exported = decoded_model(record_text(*archive, "models/model.json"), model, where);
  Program program;
  program.source = path;
  program.schema_major = exported.get_schema_version().get_major();
  program.schema_minor = exported.get_schema_version().get_minor();
  check_schema_version(program.schema_major, program.schema_minor, model);
  program.range_constraints = kept_as_text(exported.get_range_constraints());
  program.verifiers = kept_as_text(exported.get_verifiers());
  const ex::GraphModule& graph_module = exported.get_graph_module();
  const RecordField module = model / "graph_module";
  program.module_call_graph = kept_as_text(graph_module.get_module_call_graph());
  detail::read_graph(graph_module.get_graph(), module / "graph", program);
  read_signature(graph_module.get_signature(), module / "signature", program);

  read_state(archive, "data/weights/", "model_weights_config.json", program);
  read_state(archive, "data/constants/", "model_constants_config.json", program);
  check_state_feeds_graph(path, program);
  return program;
}

}  // namespace dtensor::graph
