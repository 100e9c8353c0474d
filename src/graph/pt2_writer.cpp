// Writes a program as a .pt2 archive that torch.export.load (torch 2.15) accepts, its model.json
// built from torch's generated serialization types (torch/csrc/utils/generated_serialization_types.h,
// from schema.yaml): the records it requires (archive_format, archive_version, models/model.json, the weights and constants configs,
// data/sample_inputs/model.pt, empty unless sample inputs are given) through LibTorch's PyTorchStreamWriter, which adds the
// top-level folder, .data/version and 64-byte alignment. Every state tensor is written as its own
// contiguous storage. The file appears under its final name only once complete.

#include <caffe2/serialize/inline_container.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <limits>

#include "../io/json.h"
#include "dtensor/errors.h"
#include "dtensor/graph/program.h"
#include "sample_inputs.h"
#include "serialized_enums.h"  // with torch's generated serialization types

namespace dtensor::graph {
namespace {

using json = nlohmann::json;
namespace ex = torch::_export;  // torch's own serialization types, generated from its schema.yaml

ex::SymInt sym_int(int64_t value, const std::string& expr) {
  ex::SymInt out;
  if (expr.empty()) {
    out.set_as_int(value);
    return out;
  }
  ex::SymExprHint hint;
  hint.set_as_int(value);
  ex::SymExpr e;
  e.set_expr_str(expr);
  e.set_hint(hint);
  out.set_as_expr(e);
  return out;
}

std::vector<ex::SymInt> sizes_of(const std::vector<int64_t>& values, const std::vector<std::string>& exprs) {
  std::vector<ex::SymInt> out;
  for (size_t i = 0; i < values.size(); ++i) out.push_back(sym_int(values[i], i < exprs.size() ? exprs[i] : ""));
  return out;
}

ex::Device cpu() {
  ex::Device d;
  d.set_type("cpu");
  return d;
}

ex::TensorMeta tensor_meta(const TensorMeta& m, const std::vector<std::string>& sym_sizes, const std::vector<std::string>& sym_strides,
                           int64_t storage_offset, bool requires_grad) {
  ex::TensorMeta out;
  out.set_dtype(detail::serialized_scalar_type(m.dtype));
  out.set_sizes(sizes_of(m.shape, sym_sizes));
  out.set_requires_grad(requires_grad);
  out.set_device(cpu());
  out.set_strides(sizes_of(m.stride, sym_strides));
  out.set_storage_offset(sym_int(storage_offset, ""));
  out.set_layout(detail::serialized_layout(c10::kStrided));
  return out;
}

ex::F64 number(double d) {
  ex::F64 out;
  out.set(d);  // F64 writes NaN and infinities as the strings the schema uses
  return out;
}

ex::SymIntArgument sym_size(const SymSize& s) {
  ex::SymIntArgument out;
  if (s.symbol) out.set_as_name(s.symbol->name);
  else out.set_as_int(s.value);
  return out;
}

ex::TensorArgument tensor_ref(const Value* v) {
  ex::TensorArgument out;
  out.set_name(v->name);
  return out;
}

ex::Argument none() {
  ex::Argument out;
  out.set_as_none(true);
  return out;
}

// A value produced or read by the graph: a tensor or a symbolic integer, by name.
ex::Argument value_ref(const Value* v) {
  ex::Argument out;
  if (v->is_tensor()) {
    out.set_as_tensor(tensor_ref(v));
  } else {
    ex::SymIntArgument s;
    s.set_as_name(v->name);
    out.set_as_sym_int(s);
  }
  return out;
}

// A constant argument, shaped by the schema type it is passed for (dtypes, layouts and memory formats
// are plain ints inside an IValue).
ex::Argument constant(const c10::IValue& v, const c10::TypePtr& type, const std::string& where) {
  c10::TypePtr t = type;
  if (t && t->kind() == c10::TypeKind::OptionalType) t = t->containedType(0);
  const auto kind = t ? t->kind() : c10::TypeKind::AnyType;
  ex::Argument out;
  if (v.isNone()) return none();
  if (kind == c10::TypeKind::ScalarTypeType) out.set_as_scalar_type(detail::serialized_scalar_type(v.toScalarType()));
  else if (kind == c10::TypeKind::LayoutType) out.set_as_layout(detail::serialized_layout(v.toLayout()));
  else if (kind == c10::TypeKind::MemoryFormatType) out.set_as_memory_format(detail::serialized_memory_format(v.toMemoryFormat()));
  else if (v.isBool()) out.set_as_bool(v.toBool());
  else if (v.isInt()) out.set_as_int(v.toInt());
  else if (v.isDouble()) out.set_as_float(number(v.toDouble()));
  else if (v.isString()) out.set_as_string(v.toStringRef());
  else if (v.isIntList()) out.set_as_ints(v.toIntVector());
  else if (v.isDoubleList()) {
    std::vector<ex::F64> floats;
    for (double d : v.toDoubleVector()) floats.push_back(number(d));
    out.set_as_floats(floats);
  } else if (v.isBoolList()) {
    std::vector<bool> bools;
    for (bool b : v.toBoolList()) bools.push_back(b);
    out.set_as_bools(bools);
  } else if (v.isDevice()) {
    const c10::Device d = v.toDevice();
    ex::Device device;
    device.set_type(c10::DeviceTypeName(d.type(), true));
    if (d.has_index()) device.set_index(static_cast<int64_t>(d.index()));
    out.set_as_device(device);
  } else if (v.isList()) {
    std::vector<std::string> strings;
    for (const auto& x : v.toListRef()) strings.push_back(x.toStringRef());
    out.set_as_strings(strings);
  } else {
    throw DTensorError("pt2 writer: " + where + ": cannot write the value " + v.tagKind());
  }
  return out;
}

ex::Argument argument(const Arg& a, const c10::TypePtr& type, const std::string& where) {
  ex::Argument out;
  switch (a.kind) {
    case Arg::Kind::Constant: return constant(a.constant, type, where);
    case Arg::Kind::Number:
      if (a.constant.isDouble()) out.set_as_float(number(a.constant.toDouble()));
      else if (a.constant.isBool()) out.set_as_bool(a.constant.toBool());
      else out.set_as_int(a.constant.toInt());
      break;
    case Arg::Kind::Tensor: out.set_as_tensor(tensor_ref(a.values[0])); break;
    case Arg::Kind::Tensors: {
      std::vector<ex::TensorArgument> refs;
      for (const Value* v : a.values) refs.push_back(tensor_ref(v));
      out.set_as_tensors(refs);
      break;
    }
    case Arg::Kind::OptionalTensors: {
      std::vector<ex::OptionalTensorArgument> refs(a.values.size());
      for (size_t i = 0; i < a.values.size(); ++i) {
        if (a.values[i]) refs[i].set_as_tensor(tensor_ref(a.values[i]));
        else refs[i].set_as_none(true);
      }
      out.set_as_optional_tensors(refs);
      break;
    }
    case Arg::Kind::SymInt: out.set_as_sym_int(sym_size(a.sizes[0])); break;
    case Arg::Kind::SymInts: {
      std::vector<ex::SymIntArgument> sizes;
      for (const SymSize& s : a.sizes) sizes.push_back(sym_size(s));
      out.set_as_sym_ints(sizes);
      break;
    }
  }
  return out;
}

ex::NamedArgument named(const std::string& name, ex::Argument arg, ex::ArgumentKind kind) {
  ex::NamedArgument out;
  out.set_name(name);
  out.set_arg(std::move(arg));
  out.set_kind(static_cast<int64_t>(kind));  // the schema keeps the kind as its integer
  return out;
}

ex::Node node_of(const Node& n, const Annotations& annotations) {
  if (annotations.local_kernel(n))
    throw DTensorError("node '" + n.name + "' (" + n.op_name() + ") runs dtensor's local kernel, which has no graph form "
                       "yet: this program runs (graph::run) but cannot be saved");
  std::vector<ex::NamedArgument> inputs;
  const std::string where = "node '" + n.name + "'";
  bool skipped = false;  // an argument left to its default: the ones after it can only go by name
  for (size_t i = 0; i < n.args().size(); ++i) {
    const Arg& a = n.args()[i];
    if (n.op) {
      const auto& schema_arg = n.op->schema().arguments()[i];
      if (!a.given) {
        skipped = true;
        continue;
      }
      inputs.push_back(named(schema_arg.name(), argument(a, schema_arg.type(), where),
                             schema_arg.kwarg_only() || skipped ? ex::ArgumentKind::KEYWORD : ex::ArgumentKind::POSITIONAL));
    } else {
      inputs.push_back(named(i == 0 ? "a" : "b", argument(a, nullptr, where), ex::ArgumentKind::POSITIONAL));
    }
  }
  std::vector<ex::Argument> outputs;
  const bool list_return = n.op && n.op->schema().returns().size() == 1 &&
                           n.op->schema().returns()[0].type()->kind() == c10::TypeKind::ListType;
  if (list_return) {
    std::vector<ex::TensorArgument> list;
    for (const Value* v : n.outputs) list.push_back(tensor_ref(v));
    outputs.emplace_back().set_as_tensors(list);
  } else {
    for (const Value* v : n.outputs) outputs.push_back(value_ref(v));
  }
  ex::Node out;
  out.set_target(n.target);
  out.set_inputs(inputs);
  out.set_outputs(outputs);
  out.set_metadata(std::unordered_map<std::string, std::string>(n.metadata.begin(), n.metadata.end()));
  out.set_name(n.name);
  return out;
}

ex::Graph graph_of(const Program& p) {
  std::unordered_map<std::string, ex::TensorMeta> tensor_values;
  std::unordered_map<std::string, ex::SymInt> sym_int_values;
  auto add_value = [&](const Value* v) {
    if (v->is_tensor())
      tensor_values[v->name] = tensor_meta(v->meta, v->symbolic_sizes, v->symbolic_strides, v->storage_offset, v->requires_grad);
    else
      sym_int_values[v->name] = sym_int(v->sym_hint, v->sym_expr);
  };
  std::vector<ex::Argument> inputs;
  for (const Value* v : p.graph.inputs()) {
    add_value(v);
    inputs.push_back(value_ref(v));
  }
  std::vector<ex::Node> nodes;
  for (const Node* n : p.graph.nodes()) {
    for (const Value* v : n->outputs) add_value(v);
    nodes.push_back(node_of(*n, p.annotations));
  }
  std::vector<ex::Argument> outputs;
  for (const Arg& a : p.graph.outputs()) outputs.push_back(argument(a, nullptr, "graph outputs"));
  ex::Graph out;
  out.set_inputs(inputs);
  out.set_outputs(outputs);
  out.set_nodes(nodes);
  out.set_tensor_values(tensor_values);
  out.set_sym_int_values(sym_int_values);
  out.set_is_single_tensor_return(false);
  return out;
}

// A spec of kind Spec reading `arg`, with `name` (if given) setting the name it refers to.
template <typename Spec, typename Arg, typename Name = std::nullptr_t>
Spec spec_of(const Arg& arg, Name name = nullptr) {
  Spec spec;
  spec.set_arg(arg);
  if constexpr (!std::is_same_v<Name, std::nullptr_t>) name(spec);
  return spec;
}

ex::InputSpec input_spec(const InputSpec& s) {
  const ex::TensorArgument ref = tensor_ref(s.value);
  ex::InputSpec out;
  switch (s.kind) {
    case InputSpec::Kind::Parameter:
      out.set_parameter(spec_of<ex::InputToParameterSpec>(ref, [&](auto& x) { x.set_parameter_name(s.target); }));
      break;
    case InputSpec::Kind::Buffer:
      out.set_buffer(spec_of<ex::InputToBufferSpec>(ref, [&](auto& x) {
        x.set_buffer_name(s.target);
        x.set_persistent(s.persistent);
      }));
      break;
    case InputSpec::Kind::TensorConstant:
      out.set_tensor_constant(spec_of<ex::InputToTensorConstantSpec>(ref, [&](auto& x) { x.set_tensor_constant_name(s.target); }));
      break;
    case InputSpec::Kind::UserInput: out.set_user_input(spec_of<ex::UserInputSpec>(value_ref(s.value))); break;
  }
  return out;
}

// An output spec: `a` is the graph output it describes.
ex::OutputSpec output_spec(const OutputSpec& s, const Arg& a) {
  const ex::TensorArgument ref = a.values.empty() ? ex::TensorArgument() : tensor_ref(a.values[0]);
  auto user_input = [&](auto& x) { x.set_user_input_name(s.target); };
  ex::OutputSpec out;
  switch (s.kind) {
    case OutputSpec::Kind::UserOutput: out.set_user_output(spec_of<ex::UserOutputSpec>(argument(a, nullptr, "outputs"))); break;
    case OutputSpec::Kind::LossOutput: out.set_loss_output(spec_of<ex::LossOutputSpec>(ref)); break;
    case OutputSpec::Kind::BufferMutation:
      out.set_buffer_mutation(spec_of<ex::BufferMutationSpec>(ref, [&](auto& x) { x.set_buffer_name(s.target); }));
      break;
    case OutputSpec::Kind::GradientToParameter:
      out.set_gradient_to_parameter(spec_of<ex::GradientToParameterSpec>(ref, [&](auto& x) { x.set_parameter_name(s.target); }));
      break;
    case OutputSpec::Kind::GradientToUserInput: out.set_gradient_to_user_input(spec_of<ex::GradientToUserInputSpec>(ref, user_input)); break;
    case OutputSpec::Kind::UserInputMutation: out.set_user_input_mutation(spec_of<ex::UserInputMutationSpec>(ref, user_input)); break;
  }
  return out;
}

ex::GraphSignature signature_of(const Program& p) {
  std::vector<ex::InputSpec> inputs;
  for (const InputSpec& s : p.inputs) inputs.push_back(input_spec(s));
  std::vector<ex::OutputSpec> outputs;
  for (size_t k = 0; k < p.outputs.size(); ++k) outputs.push_back(output_spec(p.outputs[k], p.graph.outputs()[k]));
  ex::GraphSignature out;
  out.set_input_specs(inputs);
  out.set_output_specs(outputs);
  return out;
}

// torch 2.15's generated F64 writer spells -inf "Infinity" (it tests isinf before the sign), which
// would load as +inf: the program's negative infinities respelled in its nodes' float arguments.
void respell_negative_infinities(const Program& p, json& model) {
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  json& nodes = model["graph_module"]["graph"]["nodes"];
  size_t k = 0;
  for (const Node* n : p.graph.nodes()) {
    json& node = nodes[k++];
    if (!n->op) continue;
    for (json& input : node["inputs"]) {
      const c10::IValue& value = n->args()[*n->op->schema().argumentIndexWithName(input["name"].get<std::string>())].constant;
      json& arg = input["arg"];
      if (arg.contains("as_float") && value.isDouble() && value.toDouble() == kMinusInf) arg["as_float"] = "-Infinity";
      if (arg.contains("as_floats") && value.isDoubleList()) {
        const std::vector<double> floats = value.toDoubleVector();
        for (size_t i = 0; i < floats.size(); ++i)
          if (floats[i] == kMinusInf) arg["as_floats"][i] = "-Infinity";
      }
    }
  }
}

ex::ExportedProgram exported_program(const Program& p) {
  ex::GraphModule module;
  module.set_graph(graph_of(p));
  module.set_signature(signature_of(p));
  module.set_module_call_graph(json::parse(p.module_call_graph).get<std::vector<ex::ModuleCallEntry>>());
  ex::SchemaVersion version;
  version.set_major(p.schema_major);
  version.set_minor(p.schema_minor);
  ex::ExportedProgram out;
  out.set_graph_module(module);
  out.set_opset_version(std::unordered_map<std::string, int64_t>{{"aten", 10}});
  out.set_range_constraints(json::parse(p.range_constraints).get<std::unordered_map<std::string, ex::RangeConstraint>>());
  out.set_schema_version(version);
  out.set_verifiers(json::parse(p.verifiers).get<std::vector<std::string>>());
  out.set_torch_version("2.15.0");
  return out;
}

// Writes the state tensors of one kind (weights: parameters and persistent buffers; constants: the
// rest) and their config.
void write_payloads(caffe2::serialize::PyTorchStreamWriter& writer, const Program& p, bool weights) {
  std::unordered_map<std::string, ex::PayloadMeta> config;
  int n = 0;
  for (const InputSpec& s : p.inputs) {
    if (s.kind == InputSpec::Kind::UserInput) continue;
    const bool is_weight = s.kind == InputSpec::Kind::Parameter || (s.kind == InputSpec::Kind::Buffer && s.persistent);
    if (is_weight != weights || config.count(s.target)) continue;
    const at::Tensor t = p.state.at(s.target).tensor().contiguous();
    const std::string name = (weights ? "weight_" : "tensor_") + std::to_string(n++);
    writer.writeRecord((weights ? "data/weights/" : "data/constants/") + name, t.data_ptr(), t.nbytes());
    const TensorMeta meta{t.sizes().vec(), t.strides().vec(), t.scalar_type()};
    ex::PayloadMeta entry;
    entry.set_path_name(name);
    entry.set_is_param(s.kind == InputSpec::Kind::Parameter);
    entry.set_use_pickle(false);
    entry.set_tensor_meta(tensor_meta(meta, {}, {}, 0, s.kind == InputSpec::Kind::Parameter));
    config.emplace(s.target, entry);
  }
  ex::PayloadConfig payloads;
  payloads.set_config(config);
  const std::string text = json(payloads).dump();
  writer.writeRecord(weights ? "data/weights/model_weights_config.json" : "data/constants/model_constants_config.json",
                     text.data(), text.size());
}

}  // namespace

void save_program(const Program& p, const std::string& path, const SaveProgramOptions& options) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  // The archive's top-level folder is named after the file, so the temporary file keeps the final
  // name, inside a private directory next to it; renaming it into place is atomic.
  const fs::path staging = (target.has_parent_path() ? target.parent_path() : fs::path(".")) /
                           (".dtensor-save-" + std::to_string(getpid()) + "-" + target.filename().string());
  fs::create_directories(staging);
  const fs::path temporary = staging / target.filename();
  try {
    json model = exported_program(p);
    respell_negative_infinities(p, model);
    caffe2::serialize::PyTorchStreamWriter writer(temporary.string());
    writer.setMinVersion(6);
    auto text = [&](const std::string& name, const std::string& content) { writer.writeRecord(name, content.data(), content.size()); };
    text("archive_format", "pt2");
    text("archive_version", "0");
    text("models/model.json", model.dump());
    text("data/sample_inputs/model.pt", options.sample_inputs.empty() ? "" : detail::sample_inputs_archive(p, options.sample_inputs));
    if (p.mesh) text("extra/dtensor.json", detail::rank_program_record(p));
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
