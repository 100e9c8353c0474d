// Reads torch.export's .pt2 archives (torch 2.15: schema 8.x). The zip part is LibTorch's
// PyTorchStreamReader (it strips the archive's top-level folder); models/model.json is the serialized
// ExportedProgram, read here with nlohmann::json following torch/_export/serde/schema.yaml: a union
// is an object with exactly one key, enums are numbers (see serialized_enums.h), arguments left at
// their schema default are absent. Weights stay in the archive (StateTensor reads them on demand).

#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include <limits>
#include <set>

#include "dtensor/errors.h"
#include "dtensor/graph/program.h"
#include "serialized_enums.h"

namespace dtensor::graph {
namespace {

using json = nlohmann::json;

// Where in the archive a problem is, for error messages.
struct Where {
  std::string file;
  std::string node;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw DTensorError(file + (node.empty() ? "" : ": node '" + node + "'") + (field.empty() ? "" : ": field '" + field + "'") +
                       ": " + what);
  }
};

// The one key of a serialized union, and its value.
std::pair<std::string, const json*> union_of(const json& j, const Where& where, const std::string& field) {
  if (!j.is_object() || j.size() != 1) where.fail(field, "expected a union (an object with one key), got " + j.dump().substr(0, 80));
  return {j.begin().key(), &j.begin().value()};
}

double number_of(const json& j) {
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  }
  return j.get<double>();
}

// ---- the archive -------------------------------------------------------------------------------------

std::unique_ptr<caffe2::serialize::PyTorchStreamReader> open_archive(const std::string& path) {
  try {
    return std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw DTensorError(path + ": not a readable .pt2 archive (torch.export.save writes one; the file may be missing, "
                              "truncated or not a zip): " + what.substr(0, what.find('\n')));
  }
}

std::string record_text(caffe2::serialize::PyTorchStreamReader& reader, const std::string& name, const Where& where) {
  if (!reader.hasRecord(name)) where.fail("", "the archive has no record " + name);
  auto [data, size] = reader.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

json record_json(caffe2::serialize::PyTorchStreamReader& reader, const std::string& name, const Where& where) {
  try {
    return json::parse(record_text(reader, name, where));
  } catch (const json::exception& e) {
    where.fail("", name + " is not valid JSON: " + e.what());
  }
}

// ---- tensor metas --------------------------------------------------------------------------------------

// A SymInt union: its example value, and its expression when dynamic ("" when static).
std::pair<int64_t, std::string> sym_int(const json& j, const Where& where, const std::string& field) {
  const auto [kind, v] = union_of(j, where, field);
  if (kind == "as_int") return {v->get<int64_t>(), ""};
  if (kind == "as_expr") {
    const json& hint = (*v)["hint"];
    if (hint.is_null()) where.fail(field, "a dynamic size without an example value (hint)");
    return {union_of(hint, where, field).second->get<int64_t>(), (*v)["expr_str"].get<std::string>()};
  }
  where.fail(field, "unsupported SymInt kind '" + kind + "'");
}

c10::ScalarType dtype_of(const json& j, const Where& where, const std::string& field) {
  const auto type = detail::scalar_type_from_serialized(j.get<int64_t>());
  if (!type) where.fail(field, "unsupported dtype code " + j.dump());
  return *type;
}

void read_tensor_meta(const json& m, Value& v, const Where& where) {
  v.meta.dtype = dtype_of(m.at("dtype"), where, "tensor_values." + v.name + ".dtype");
  for (const json& s : m.at("sizes")) {
    auto [size, expr] = sym_int(s, where, "tensor_values." + v.name + ".sizes");
    v.meta.shape.push_back(size);
    v.symbolic_sizes.push_back(expr);
  }
  for (const json& s : m.at("strides")) {
    auto [stride, expr] = sym_int(s, where, "tensor_values." + v.name + ".strides");
    v.meta.stride.push_back(stride);
    v.symbolic_strides.push_back(expr);
  }
  v.storage_offset = sym_int(m.at("storage_offset"), where, "tensor_values." + v.name + ".storage_offset").first;
  v.requires_grad = m.value("requires_grad", false);
  const auto layout = detail::layout_from_serialized(m.value("layout", int64_t{7}));
  if (layout != c10::kStrided) where.fail("tensor_values." + v.name + ".layout", "only strided tensors are supported");
}

// ---- the state: weights and constants -----------------------------------------------------------------

// The zip local header's compression method must be "stored" for byte-range reads to be possible.
bool stored_uncompressed(const std::string& path, caffe2::serialize::PyTorchStreamReader& reader, const std::string& record) {
  const size_t header = reader.getRecordHeaderOffset(record);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  unsigned char bytes[10] = {};
  const bool ok = std::fseek(f, static_cast<long>(header), SEEK_SET) == 0 && std::fread(bytes, 1, sizeof bytes, f) == sizeof bytes;
  std::fclose(f);
  return ok && bytes[0] == 'P' && bytes[1] == 'K' && bytes[8] == 0 && bytes[9] == 0;
}

void read_payloads(caffe2::serialize::PyTorchStreamReader& reader, const std::string& path, const std::string& dir,
                   Program& program) {
  const std::string config_name = dir + "model_" + (dir == "data/weights/" ? "weights" : "constants") + "_config.json";
  const Where where{path, ""};
  const json config = record_json(reader, config_name, where);
  for (const auto& [fqn, entry] : config.at("config").items()) {
    const std::string field = config_name + ": " + fqn;
    if (entry.value("use_pickle", false)) where.fail(field, "pickled tensors (tensor subclasses) are not supported");
    const std::string record = dir + entry.at("path_name").get<std::string>();
    if (!reader.hasRecord(record)) where.fail(field, "the weight record " + record + " is missing from the archive");
    Value meta_holder;
    meta_holder.name = fqn;
    read_tensor_meta(entry.at("tensor_meta"), meta_holder, where);
    const int64_t bytes = static_cast<int64_t>(reader.getRecordSize(record));
    const int64_t element = static_cast<int64_t>(c10::elementSize(meta_holder.meta.dtype));
    if (!stored_uncompressed(path, reader, record)) {
      // A compressed record cannot be read by byte ranges: read it whole now.
      auto [data, size] = reader.getRecord(record);
      at::Tensor storage = at::empty({static_cast<int64_t>(size) / element}, at::TensorOptions().dtype(meta_holder.meta.dtype));
      std::memcpy(storage.data_ptr(), data.get(), size);
      program.state.emplace(fqn, StateTensor(storage.as_strided(meta_holder.meta.shape, meta_holder.meta.stride,
                                                                  meta_holder.storage_offset).clone()));
      continue;
    }
    program.state.emplace(fqn, StateTensor(path, record, static_cast<int64_t>(reader.getRecordOffset(record)), bytes / element,
                                           meta_holder.meta, meta_holder.storage_offset));
  }
}

// ---- nodes -----------------------------------------------------------------------------------------------

struct Reader {
  Program& program;
  Where where;
  const json& tensor_values;
  const json& sym_int_values;

  Value* tensor_named(const std::string& name, const std::string& field) {
    Value* v = program.graph.find_value(name);
    if (!v) where.fail(field, "refers to '" + name + "', which no earlier node or input defines");
    return v;
  }

  SymSize sym_size(const json& j, const std::string& field) {
    const auto [kind, v] = union_of(j, where, field);
    if (kind == "as_int") return {v->get<int64_t>(), nullptr};
    if (kind == "as_name") return {0, tensor_named(v->get<std::string>(), field)};
    where.fail(field, "unsupported SymIntArgument kind '" + kind + "'");
  }

  static bool takes_tensor(const c10::Argument& a) {
    const auto kind = a.type()->kind();
    return kind == c10::TypeKind::TensorType ||
           (kind == c10::TypeKind::OptionalType && a.type()->containedType(0)->kind() == c10::TypeKind::TensorType);
  }

  Arg argument(const json& j, const c10::Argument* schema, const std::string& field) {
    const auto [kind, v] = union_of(j, where, field);
    const bool tensor_arg = schema && takes_tensor(*schema);
    if (kind == "as_none") return Arg::of(c10::IValue());
    if (kind == "as_tensor") return Arg::tensor(tensor_named(v->at("name").get<std::string>(), field));
    if (kind == "as_optional_tensor") {
      const auto [k, t] = union_of(*v, where, field);
      return k == "as_none" ? Arg::of(c10::IValue()) : Arg::tensor(tensor_named(t->at("name").get<std::string>(), field));
    }
    if (kind == "as_tensors" || kind == "as_optional_tensors") {
      const bool optional = kind == "as_optional_tensors" ||
                            (schema && schema->type()->kind() == c10::TypeKind::ListType &&
                             schema->type()->containedType(0)->kind() == c10::TypeKind::OptionalType);
      Arg a{optional ? Arg::Kind::OptionalTensors : Arg::Kind::Tensors};
      for (const json& t : *v) {
        if (kind == "as_tensors") {
          a.values.push_back(tensor_named(t.at("name").get<std::string>(), field));
          continue;
        }
        const auto [k, x] = union_of(t, where, field);
        a.values.push_back(k == "as_none" ? nullptr : tensor_named(x->at("name").get<std::string>(), field));
      }
      return a;
    }
    if (kind == "as_int" || kind == "as_float") {
      const c10::IValue number = kind == "as_int" ? c10::IValue(v->get<int64_t>()) : c10::IValue(number_of(*v));
      return tensor_arg ? Arg{Arg::Kind::Number, number} : Arg::of(number);
    }
    if (kind == "as_bool") return tensor_arg ? Arg{Arg::Kind::Number, c10::IValue(v->get<bool>())} : Arg::of(v->get<bool>());
    if (kind == "as_ints") return Arg::of(v->get<std::vector<int64_t>>());
    if (kind == "as_floats") {
      std::vector<double> out;
      for (const json& x : *v) out.push_back(number_of(x));
      return Arg::of(out);
    }
    if (kind == "as_bools") {
      c10::List<bool> bools;
      for (const json& b : *v) bools.push_back(b.get<bool>());
      return Arg::of(bools);
    }
    if (kind == "as_string") return Arg::of(v->get<std::string>());
    if (kind == "as_strings") {
      c10::List<std::string> strings;
      for (const json& x : *v) strings.push_back(x.get<std::string>());
      return Arg::of(strings);
    }
    if (kind == "as_sym_int") {
      Arg a{Arg::Kind::SymInt};
      a.sizes.push_back(sym_size(*v, field));
      return a;
    }
    if (kind == "as_sym_ints") {
      Arg a{Arg::Kind::SymInts};
      for (const json& s : *v) a.sizes.push_back(sym_size(s, field));
      return a;
    }
    if (kind == "as_scalar_type") return Arg::of(dtype_of(*v, where, field));
    if (kind == "as_layout") {
      const auto layout = detail::layout_from_serialized(v->get<int64_t>());
      if (!layout) where.fail(field, "unsupported layout code " + v->dump());
      return Arg::of(*layout);
    }
    if (kind == "as_memory_format") {
      const auto format = detail::memory_format_from_serialized(v->get<int64_t>());
      if (!format) where.fail(field, "unsupported memory format code " + v->dump());
      return Arg::of(*format);
    }
    if (kind == "as_device") {
      const std::string type = v->at("type").get<std::string>();
      const json& index = (*v)["index"];
      return Arg::of(c10::Device(type + (index.is_null() ? "" : ":" + std::to_string(index.get<int64_t>()))));
    }
    where.fail(field, "unsupported argument kind '" + kind + "'");
  }

  // The innermost entry of "key,path,type;key,path,type;...".
  static void module_of(const std::string& stack, Node& node) {
    const auto last = stack.rfind(';');
    const std::string entry = last == std::string::npos ? stack : stack.substr(last + 1);
    const auto first_comma = entry.find(','), second_comma = entry.find(',', first_comma + 1);
    if (first_comma == std::string::npos || second_comma == std::string::npos) return;
    node.module_path = entry.substr(first_comma + 1, second_comma - first_comma - 1);
    node.module_type = entry.substr(second_comma + 1);
  }

  // A value the file defines (a graph input, or a node output), with its meta.
  Value* define(const std::string& name, Value::Kind kind, bool graph_input = false) {
    Value* v = graph_input ? program.graph.add_input(name, kind) : program.graph.new_value(name, kind);
    if (v->name != name) where.fail("outputs", "the name '" + name + "' is defined twice");
    if (kind == Value::Kind::Tensor) {
      if (!tensor_values.contains(name)) where.fail("outputs", "no tensor_values entry for '" + name + "'");
      read_tensor_meta(tensor_values[name], *v, where);
    } else if (sym_int_values.contains(name)) {
      const auto [hint, expr] = sym_int(sym_int_values[name], where, "sym_int_values." + name);
      v->sym_hint = hint;
      v->sym_expr = expr;
    }
    return v;
  }

  void node(const json& n) {
    auto node = std::make_unique<Node>();
    node->target = n.at("target").get<std::string>();
    node->name = n.value("name", "");
    where.node = node->name.empty() ? node->target : node->name;
    if (n.contains("metadata"))
      for (const auto& [k, v] : n["metadata"].items())
        if (v.is_string()) node->metadata[k] = v.get<std::string>();
    if (node->metadata.count("nn_module_stack")) module_of(node->metadata["nn_module_stack"], *node);

    const std::string prefix = "torch.ops.";
    if (node->target.rfind(prefix, 0) == 0) {
      // torch.ops.<ns>.<op>.<overload>, overload "default" meaning the unnamed one.
      std::string rest = node->target.substr(prefix.size());
      const auto ns_end = rest.find('.'), op_end = rest.rfind('.');
      if (ns_end == std::string::npos || op_end == ns_end) where.fail("target", "cannot parse '" + node->target + "'");
      const std::string name = rest.substr(0, ns_end) + "::" + rest.substr(ns_end + 1, op_end - ns_end - 1);
      std::string overload = rest.substr(op_end + 1);
      if (overload == "default") overload.clear();
      auto op = c10::Dispatcher::singleton().findSchema({name, overload});
      if (!op) where.fail("target", "the op " + node->target + " is unknown to the ATen dispatcher of this LibTorch");
      node->op = *op;
      const auto& schema = op->schema();
      std::vector<std::optional<Arg>> args(schema.arguments().size());
      for (const json& a : n.at("inputs")) {
        const std::string arg_name = a.at("name").get<std::string>();
        const auto index = schema.argumentIndexWithName(arg_name);
        if (!index) where.fail("inputs." + arg_name, schema.name() + " has no argument of that name");
        args[*index] = argument(a.at("arg"), &schema.arguments()[*index], "inputs." + arg_name);
        args[*index]->keyword = a.value("kind", 1) == 2;
      }
      for (size_t i = 0; i < args.size(); ++i) {
        if (args[i]) {
          node->args.push_back(std::move(*args[i]));
          continue;
        }
        const auto& a = schema.arguments()[i];
        if (!a.default_value()) where.fail("inputs." + a.name(), "a required argument is missing");
        Arg d = Arg::of(*a.default_value());
        d.given = false;
        d.keyword = a.kwarg_only();
        node->args.push_back(std::move(d));
      }
    } else if (node->target.rfind("_operator.", 0) == 0) {
      for (const json& a : n.at("inputs")) node->args.push_back(argument(a.at("arg"), nullptr, "inputs." + a.at("name").get<std::string>()));
    } else {
      where.fail("target", "unsupported kind of node '" + node->target + "' (only torch.ops.* and _operator.* calls)");
    }

    for (const json& o : n.at("outputs")) {
      const auto [kind, v] = union_of(o, where, "outputs");
      if (kind == "as_tensor") node->outputs.push_back(define(v->at("name").get<std::string>(), Value::Kind::Tensor));
      else if (kind == "as_sym_int") node->outputs.push_back(define(v->at("as_name").get<std::string>(), Value::Kind::SymInt));
      else if (kind == "as_tensors")
        for (const json& t : *v) node->outputs.push_back(define(t.at("name").get<std::string>(), Value::Kind::Tensor));
      else if (kind == "as_none") continue;
      else where.fail("outputs", "unsupported output kind '" + kind + "'");
    }
    if (node->name.empty()) node->name = node->outputs.empty() ? node->target : node->outputs[0]->name;
    program.graph.append(std::move(node));
    where.node.clear();
  }
};

InputSpec input_spec(const json& spec, Graph& graph, const Where& where) {
  const auto [kind, v] = union_of(spec, where, "signature.input_specs");
  auto named = [&](const json& arg) {
    Value* value = graph.find_value(arg.at("name").get<std::string>());
    if (!value) where.fail("signature.input_specs", "no graph input named " + arg.dump());
    return value;
  };
  if (kind == "parameter") return {InputSpec::Kind::Parameter, named(v->at("arg")), v->at("parameter_name").get<std::string>()};
  if (kind == "buffer")
    return {InputSpec::Kind::Buffer, named(v->at("arg")), v->at("buffer_name").get<std::string>(), v->value("persistent", true)};
  if (kind == "tensor_constant")
    return {InputSpec::Kind::TensorConstant, named(v->at("arg")), v->at("tensor_constant_name").get<std::string>()};
  if (kind == "user_input") {
    const auto [k, a] = union_of(v->at("arg"), where, "signature.input_specs.user_input");
    const std::string name = k == "as_tensor" ? a->at("name").get<std::string>() : a->at("as_name").get<std::string>();
    Value* value = graph.find_value(name);
    if (!value) where.fail("signature.input_specs", "no graph input named " + name);
    return {InputSpec::Kind::UserInput, value, ""};
  }
  where.fail("signature.input_specs", "unsupported input kind '" + kind + "'");
}

OutputSpec output_spec(const json& spec, const Where& where) {
  const auto [kind, v] = union_of(spec, where, "signature.output_specs");
  if (kind == "user_output") return {OutputSpec::Kind::UserOutput, ""};
  if (kind == "buffer_mutation") return {OutputSpec::Kind::BufferMutation, v->at("buffer_name").get<std::string>()};
  if (kind == "loss_output") return {OutputSpec::Kind::LossOutput, ""};
  if (kind == "gradient_to_parameter") return {OutputSpec::Kind::GradientToParameter, v->at("parameter_name").get<std::string>()};
  if (kind == "gradient_to_user_input") return {OutputSpec::Kind::GradientToUserInput, v->at("user_input_name").get<std::string>()};
  if (kind == "user_input_mutation") return {OutputSpec::Kind::UserInputMutation, v->at("user_input_name").get<std::string>()};
  where.fail("signature.output_specs", "unsupported output kind '" + kind + "'");
}

}  // namespace

Program load_program(const std::string& path) {
  auto reader = open_archive(path);
  const Where where{path, ""};
  if (reader->hasRecord("archive_format") && record_text(*reader, "archive_format", where) != "pt2")
    where.fail("archive_format", "not a pt2 archive");
  const json model = record_json(*reader, "models/model.json", where);
  Program program;
  program.source = path;
  const json& version = model.at("schema_version");
  program.schema_major = version.at("major").get<int64_t>();
  program.schema_minor = version.at("minor").get<int64_t>();
  if (program.schema_major != 8)
    where.fail("schema_version", "schema version " + std::to_string(program.schema_major) + "." +
                                     std::to_string(program.schema_minor) + " is not supported (dtensor reads 8.x, torch 2.15's)");
  program.range_constraints = model.value("range_constraints", json::object()).dump();
  program.verifiers = model.value("verifiers", json::array()).dump();
  const json& module = model.at("graph_module");
  program.module_call_graph = module.value("module_call_graph", json::array()).dump();
  const json& g = module.at("graph");
  Reader r{program, where, g.at("tensor_values"), g.value("sym_int_values", json::object())};

  for (const json& in : g.at("inputs")) {
    const auto [kind, v] = union_of(in, where, "graph.inputs");
    if (kind == "as_tensor") r.define(v->at("name").get<std::string>(), Value::Kind::Tensor, true);
    else if (kind == "as_sym_int") r.define(v->at("as_name").get<std::string>(), Value::Kind::SymInt, true);
    else where.fail("graph.inputs", "unsupported input kind '" + kind + "'");
  }
  for (const json& n : g.at("nodes")) r.node(n);
  for (const json& out : g.at("outputs")) program.graph.outputs().push_back(r.argument(out, nullptr, "graph.outputs"));

  const json& signature = module.at("signature");
  for (const json& spec : signature.at("input_specs")) program.inputs.push_back(input_spec(spec, program.graph, where));
  for (const json& spec : signature.at("output_specs")) program.outputs.push_back(output_spec(spec, where));
  if (program.inputs.size() != program.graph.inputs().size() || program.outputs.size() != program.graph.outputs().size())
    where.fail("signature", "the signature does not match the graph's inputs and outputs");

  read_payloads(*reader, path, "data/weights/", program);
  read_payloads(*reader, path, "data/constants/", program);
  for (const InputSpec& spec : program.inputs)
    if (spec.kind != InputSpec::Kind::UserInput && !program.state.count(spec.target))
      where.fail("signature.input_specs", "'" + spec.target + "' has no tensor in the archive's weights or constants");
  return program;
}

}  // namespace dtensor::graph
