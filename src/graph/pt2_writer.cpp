// Writes a program as a .pt2 archive that torch.export.load (torch 2.15) accepts: the records it
// requires (archive_format, archive_version, models/model.json, the weights and constants configs,
// an empty data/sample_inputs/model.pt) through LibTorch's PyTorchStreamWriter, which adds the
// top-level folder, .data/version and 64-byte alignment. Every state tensor is written as its own
// contiguous storage. The file appears under its final name only once complete.

#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "dtensor/errors.h"
#include "dtensor/graph/program.h"
#include "serialized_enums.h"

namespace dtensor::graph {
namespace {

using json = nlohmann::json;

json sym_int(int64_t value, const std::string& expr) {
  if (expr.empty()) return {{"as_int", value}};
  return {{"as_expr", {{"expr_str", expr}, {"hint", {{"as_int", value}}}}}};
}

json sizes_of(const std::vector<int64_t>& values, const std::vector<std::string>& exprs) {
  json out = json::array();
  for (size_t i = 0; i < values.size(); ++i) out.push_back(sym_int(values[i], i < exprs.size() ? exprs[i] : ""));
  return out;
}

json tensor_meta(const TensorMeta& m, const std::vector<std::string>& sym_sizes, const std::vector<std::string>& sym_strides,
                 int64_t storage_offset, bool requires_grad) {
  return {{"dtype", detail::serialized_scalar_type(m.dtype)},
          {"sizes", sizes_of(m.shape, sym_sizes)},
          {"requires_grad", requires_grad},
          {"device", {{"type", "cpu"}, {"index", nullptr}}},
          {"strides", sizes_of(m.stride, sym_strides)},
          {"storage_offset", {{"as_int", storage_offset}}},
          {"layout", detail::serialized_layout(c10::kStrided)}};
}

json number(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return d;
}

json sym_size(const SymSize& s) { return s.symbol ? json{{"as_name", s.symbol->name}} : json{{"as_int", s.value}}; }

json tensor_ref(const Value* v) { return {{"name", v->name}}; }

// A constant argument, shaped by the schema type it is passed for (dtypes, layouts and memory formats
// are plain ints inside an IValue).
json constant(const c10::IValue& v, const c10::TypePtr& type, const std::string& where) {
  c10::TypePtr t = type;
  if (t && t->kind() == c10::TypeKind::OptionalType) t = t->containedType(0);
  const auto kind = t ? t->kind() : c10::TypeKind::AnyType;
  if (v.isNone()) return {{"as_none", true}};
  if (kind == c10::TypeKind::ScalarTypeType) return {{"as_scalar_type", detail::serialized_scalar_type(v.toScalarType())}};
  if (kind == c10::TypeKind::LayoutType) return {{"as_layout", detail::serialized_layout(v.toLayout())}};
  if (kind == c10::TypeKind::MemoryFormatType) return {{"as_memory_format", detail::serialized_memory_format(v.toMemoryFormat())}};
  if (v.isBool()) return {{"as_bool", v.toBool()}};
  if (v.isInt()) return {{"as_int", v.toInt()}};
  if (v.isDouble()) return {{"as_float", number(v.toDouble())}};
  if (v.isString()) return {{"as_string", v.toStringRef()}};
  if (v.isIntList()) return {{"as_ints", v.toIntVector()}};
  if (v.isDoubleList()) {
    json out = json::array();
    for (double d : v.toDoubleVector()) out.push_back(number(d));
    return {{"as_floats", out}};
  }
  if (v.isBoolList()) {
    json out = json::array();
    for (bool b : v.toBoolList()) out.push_back(b);
    return {{"as_bools", out}};
  }
  if (v.isDevice()) {
    const c10::Device d = v.toDevice();
    return {{"as_device", {{"type", c10::DeviceTypeName(d.type(), true)}, {"index", d.has_index() ? json(d.index()) : json(nullptr)}}}};
  }
  if (v.isList()) {
    json out = json::array();
    for (const auto& s : v.toListRef()) out.push_back(s.toStringRef());
    return {{"as_strings", out}};
  }
  throw DTensorError("pt2 writer: " + where + ": cannot write the value " + v.tagKind());
}

json argument(const Arg& a, const c10::TypePtr& type, const std::string& where) {
  switch (a.kind) {
    case Arg::Kind::Constant: return constant(a.constant, type, where);
    case Arg::Kind::Number:
      if (a.constant.isDouble()) return {{"as_float", number(a.constant.toDouble())}};
      if (a.constant.isBool()) return {{"as_bool", a.constant.toBool()}};
      return {{"as_int", a.constant.toInt()}};
    case Arg::Kind::Tensor: return {{"as_tensor", tensor_ref(a.values[0])}};
    case Arg::Kind::Tensors: {
      json out = json::array();
      for (const Value* v : a.values) out.push_back(tensor_ref(v));
      return {{"as_tensors", out}};
    }
    case Arg::Kind::OptionalTensors: {
      json out = json::array();
      for (const Value* v : a.values) out.push_back(v ? json{{"as_tensor", tensor_ref(v)}} : json{{"as_none", true}});
      return {{"as_optional_tensors", out}};
    }
    case Arg::Kind::SymInt: return {{"as_sym_int", sym_size(a.sizes[0])}};
    case Arg::Kind::SymInts: {
      json out = json::array();
      for (const SymSize& s : a.sizes) out.push_back(sym_size(s));
      return {{"as_sym_ints", out}};
    }
  }
  return {};
}

json node_json(const Node& n) {
  if (n.local_kernel)
    throw DTensorError("node '" + n.name + "' (" + n.op_name() + ") runs dtensor's local kernel, which has no graph form "
                       "yet: this program runs (graph::run) but cannot be saved");
  json inputs = json::array();
  const std::string where = "node '" + n.name + "'";
  for (size_t i = 0; i < n.args.size(); ++i) {
    const Arg& a = n.args[i];
    if (n.op) {
      const auto& schema_arg = n.op->schema().arguments()[i];
      if (!a.given) continue;
      inputs.push_back({{"name", schema_arg.name()},
                        {"arg", argument(a, schema_arg.type(), where)},
                        {"kind", schema_arg.kwarg_only() ? 2 : 1}});
    } else {
      inputs.push_back({{"name", i == 0 ? "a" : "b"}, {"arg", argument(a, nullptr, where)}, {"kind", 1}});
    }
  }
  json outputs = json::array();
  const bool list_return = n.op && n.op->schema().returns().size() == 1 &&
                           n.op->schema().returns()[0].type()->kind() == c10::TypeKind::ListType;
  if (list_return) {
    json list = json::array();
    for (const Value* v : n.outputs) list.push_back(tensor_ref(v));
    outputs.push_back({{"as_tensors", list}});
  } else {
    for (const Value* v : n.outputs)
      outputs.push_back(v->is_tensor() ? json{{"as_tensor", tensor_ref(v)}} : json{{"as_sym_int", {{"as_name", v->name}}}});
  }
  json metadata = json::object();
  for (const auto& [k, v] : n.metadata) metadata[k] = v;
  return {{"target", n.target}, {"inputs", inputs},   {"outputs", outputs},
          {"metadata", metadata}, {"is_hop_single_tensor_return", nullptr}, {"name", n.name}};
}

void add_value(const Value* v, json& tensor_values, json& sym_int_values) {
  if (v->is_tensor())
    tensor_values[v->name] = tensor_meta(v->meta, v->symbolic_sizes, v->symbolic_strides, v->storage_offset, v->requires_grad);
  else
    sym_int_values[v->name] = sym_int(v->sym_hint, v->sym_expr);
}

json graph_json(const Program& p) {
  json tensor_values = json::object(), sym_int_values = json::object(), nodes = json::array(), inputs = json::array();
  for (const Value* v : p.graph.inputs()) {
    add_value(v, tensor_values, sym_int_values);
    inputs.push_back(v->is_tensor() ? json{{"as_tensor", tensor_ref(v)}} : json{{"as_sym_int", {{"as_name", v->name}}}});
  }
  for (const Node* n : p.graph.nodes()) {
    for (const Value* v : n->outputs) add_value(v, tensor_values, sym_int_values);
    nodes.push_back(node_json(*n));
  }
  json outputs = json::array();
  for (const Arg& a : p.graph.outputs()) outputs.push_back(argument(a, nullptr, "graph outputs"));
  return {{"inputs", inputs},
          {"outputs", outputs},
          {"nodes", nodes},
          {"tensor_values", tensor_values},
          {"sym_int_values", sym_int_values},
          {"sym_bool_values", json::object()},
          {"is_single_tensor_return", false},
          {"custom_obj_values", json::object()},
          {"sym_float_values", json::object()}};
}

json signature_json(const Program& p) {
  json inputs = json::array(), outputs = json::array();
  for (const InputSpec& s : p.inputs) {
    const json arg = tensor_ref(s.value);
    switch (s.kind) {
      case InputSpec::Kind::Parameter: inputs.push_back({{"parameter", {{"arg", arg}, {"parameter_name", s.target}}}}); break;
      case InputSpec::Kind::Buffer:
        inputs.push_back({{"buffer", {{"arg", arg}, {"buffer_name", s.target}, {"persistent", s.persistent}}}});
        break;
      case InputSpec::Kind::TensorConstant:
        inputs.push_back({{"tensor_constant", {{"arg", arg}, {"tensor_constant_name", s.target}}}});
        break;
      case InputSpec::Kind::UserInput:
        inputs.push_back({{"user_input", {{"arg", s.value->is_tensor() ? json{{"as_tensor", arg}}
                                                                        : json{{"as_sym_int", {{"as_name", s.value->name}}}}}}}});
        break;
    }
  }
  const auto& graph_outputs = p.graph.outputs();
  for (size_t k = 0; k < p.outputs.size(); ++k) {
    const OutputSpec& s = p.outputs[k];
    const Arg& a = graph_outputs[k];
    const json ref = a.values.empty() ? json::object() : tensor_ref(a.values[0]);
    switch (s.kind) {
      case OutputSpec::Kind::UserOutput: outputs.push_back({{"user_output", {{"arg", argument(a, nullptr, "outputs")}}}}); break;
      case OutputSpec::Kind::BufferMutation: outputs.push_back({{"buffer_mutation", {{"arg", ref}, {"buffer_name", s.target}}}}); break;
      case OutputSpec::Kind::LossOutput: outputs.push_back({{"loss_output", {{"arg", ref}}}}); break;
      case OutputSpec::Kind::GradientToParameter:
        outputs.push_back({{"gradient_to_parameter", {{"arg", ref}, {"parameter_name", s.target}}}});
        break;
      case OutputSpec::Kind::GradientToUserInput:
        outputs.push_back({{"gradient_to_user_input", {{"arg", ref}, {"user_input_name", s.target}}}});
        break;
      case OutputSpec::Kind::UserInputMutation:
        outputs.push_back({{"user_input_mutation", {{"arg", ref}, {"user_input_name", s.target}}}});
        break;
    }
  }
  return {{"input_specs", inputs}, {"output_specs", outputs}};
}

// Writes the state tensors of one kind (weights: parameters and persistent buffers; constants: the
// rest) and their config.
void write_payloads(caffe2::serialize::PyTorchStreamWriter& writer, const Program& p, bool weights) {
  json config = json::object();
  int n = 0;
  for (const InputSpec& s : p.inputs) {
    if (s.kind == InputSpec::Kind::UserInput) continue;
    const bool is_weight = s.kind == InputSpec::Kind::Parameter || (s.kind == InputSpec::Kind::Buffer && s.persistent);
    if (is_weight != weights || config.contains(s.target)) continue;
    const at::Tensor t = p.state.at(s.target).tensor().contiguous();
    const std::string name = (weights ? "weight_" : "tensor_") + std::to_string(n++);
    writer.writeRecord((weights ? "data/weights/" : "data/constants/") + name, t.data_ptr(), t.nbytes());
    const TensorMeta meta{t.sizes().vec(), t.strides().vec(), t.scalar_type()};
    config[s.target] = {{"path_name", name},
                        {"is_param", s.kind == InputSpec::Kind::Parameter},
                        {"use_pickle", false},
                        {"tensor_meta", tensor_meta(meta, {}, {}, 0, s.kind == InputSpec::Kind::Parameter)}};
  }
  const std::string text = json{{"config", config}}.dump();
  writer.writeRecord(weights ? "data/weights/model_weights_config.json" : "data/constants/model_constants_config.json",
                     text.data(), text.size());
}

}  // namespace

void save_program(const Program& p, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  // The archive's top-level folder is named after the file, so the temporary file keeps the final
  // name, inside a private directory next to it; renaming it into place is atomic.
  const fs::path staging = (target.has_parent_path() ? target.parent_path() : fs::path(".")) /
                           (".dtensor-save-" + std::to_string(getpid()) + "-" + target.filename().string());
  fs::create_directories(staging);
  const fs::path temporary = staging / target.filename();
  try {
    json model = {{"graph_module",
                   {{"graph", graph_json(p)},
                    {"signature", signature_json(p)},
                    {"module_call_graph", json::parse(p.module_call_graph)},
                    {"metadata", json::object()},
                    {"treespec_namedtuple_fields", json::object()}}},
                  {"opset_version", {{"aten", 10}}},
                  {"range_constraints", json::parse(p.range_constraints)},
                  {"schema_version", {{"major", p.schema_major}, {"minor", p.schema_minor}}},
                  {"verifiers", json::parse(p.verifiers)},
                  {"torch_version", "2.15.0"},
                  {"guards_code", json::array()}};
    caffe2::serialize::PyTorchStreamWriter writer(temporary.string());
    writer.setMinVersion(6);
    auto text = [&](const std::string& name, const std::string& content) { writer.writeRecord(name, content.data(), content.size()); };
    text("archive_format", "pt2");
    text("archive_version", "0");
    text("models/model.json", model.dump());
    text("data/sample_inputs/model.pt", "");
    write_payloads(writer, p, true);
    write_payloads(writer, p, false);
    writer.writeEndOfFile();
    fs::rename(temporary, target);
    fs::remove_all(staging);
  } catch (const std::exception& e) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    throw DTensorError("save_program(" + path + "): " + e.what());
  }
}

}  // namespace dtensor::graph
