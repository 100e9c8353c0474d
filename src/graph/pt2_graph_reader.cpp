#include "pt2_graph_reader.h"

#include <limits>

#include "../io/checked_int.h"
#include "dtensor/errors.h"
#include "integer_ops.h"
#include "serialized_enums.h"

namespace dtensor::graph::detail {
namespace {

namespace ex = torch::_export;

int64_t non_negative(int64_t value, const RecordField& field) {
  if (value < 0) field.fail("expected an integer >= 0, found " + std::to_string(value));
  return value;
}

// A SymInt (sizes, strides, offsets: never negative): its example value, and its sympy expression when
// dynamic ("" when static).
std::pair<int64_t, std::string> sym_int(const ex::SymInt& s, const RecordField& field) {
  if (s.tag() == ex::SymInt::Tag::AS_INT) return {non_negative(s.get_as_int(), field / "as_int"), ""};
  const ex::SymExpr& expr = s.get_as_expr();
  const RecordField at = field / "as_expr";
  if (expr.get_expr_str().empty()) (at / "expr_str").fail("an empty expression");
  const auto& hint = expr.get_hint();
  if (!hint) at.fail("a dynamic size without an example value (hint)");
  if (hint->tag() != ex::SymExprHint::Tag::AS_INT)
    (at / "hint").fail("expected an integer example value (as_int), found '" + kind_name(ex::printEnum(hint->tag())) + "'");
  return {non_negative(hint->get_as_int(), at / "hint" / "as_int"), expr.get_expr_str()};
}

c10::ScalarType dtype_of(int64_t code, const RecordField& field) {
  const auto type = scalar_type_from_serialized(code);
  if (!type) field.fail("unsupported dtype code " + std::to_string(code));
  return *type;
}

bool takes_tensor(const c10::Argument& a) {
  const auto kind = a.type()->kind();
  return kind == c10::TypeKind::TensorType ||
         (kind == c10::TypeKind::OptionalType && a.type()->containedType(0)->kind() == c10::TypeKind::TensorType);
}

bool takes_optional_tensor_list(const c10::Argument& a) {
  return a.type()->kind() == c10::TypeKind::ListType && a.type()->containedType(0)->kind() == c10::TypeKind::OptionalType;
}

// The innermost entry of "key,path,type;key,path,type;...".
void module_of(const std::string& stack, Node& node) {
  const auto last = stack.rfind(';');
  const std::string entry = last == std::string::npos ? stack : stack.substr(last + 1);
  const auto first_comma = entry.find(','), second_comma = entry.find(',', first_comma + 1);
  if (first_comma == std::string::npos || second_comma == std::string::npos) return;
  node.module_path = entry.substr(first_comma + 1, second_comma - first_comma - 1);
  node.module_type = entry.substr(second_comma + 1);
}

class GraphReader {
 public:
  GraphReader(Program& program, const ex::Graph& graph, const RecordField& field) : program_(program), graph_(graph), field_(field) {}

  void read() {
    const RecordField inputs = field_ / "inputs";
    for (size_t i = 0; i < graph_.get_inputs().size(); ++i) {
      const RecordScope scope(field_);
      const ex::Argument& in = graph_.get_inputs()[i];
      const RecordField at = inputs / i;
      if (in.tag() == ex::Argument::Tag::AS_TENSOR) define(in.get_as_tensor().get_name(), at / "as_tensor" / "name", Value::Kind::Tensor, true);
      else if (in.tag() == ex::Argument::Tag::AS_SYM_INT) sym_int_input(in.get_as_sym_int(), at / "as_sym_int");
      else at.fail("unsupported input kind '" + kind_name(ex::printEnum(in.tag())) + "'");
    }
    const RecordField nodes = field_ / "nodes";
    for (size_t i = 0; i < graph_.get_nodes().size(); ++i) {
      const RecordScope scope(field_);
      const ex::Node& n = graph_.get_nodes()[i];
      node(n, nodes.node(i, n.get_name().value_or("")));
    }
    const RecordField outputs = field_ / "outputs";
    for (size_t i = 0; i < graph_.get_outputs().size(); ++i) {
      const RecordScope scope(field_);
      program_.graph.add_output(argument(graph_.get_outputs()[i], outputs / i, nullptr));
    }
  }

 private:
  void sym_int_input(const ex::SymIntArgument& s, const RecordField& at) {
    if (s.tag() != ex::SymIntArgument::Tag::AS_NAME) at.fail("a symbolic integer input must be named (as_name)");
    define(s.get_as_name(), at / "as_name", Value::Kind::SymInt, true);
  }

  Value* named(const std::string& name, const RecordField& at) {
    Value* v = program_.graph.find_value(name);
    if (!v) at.fail("refers to '" + name.substr(0, 200) + "', which no earlier node or input defines");
    return v;
  }

  Value* symbol_named(const std::string& name, const RecordField& at) {
    Value* v = named(name, at);
    if (v->is_tensor()) at.fail("refers to '" + v->name + "', a tensor, where a symbolic integer belongs");
    return v;
  }

  Value* tensor_ref(const ex::TensorArgument& t, const RecordField& at) {
    Value* v = named(t.get_name(), at / "name");
    if (!v->is_tensor()) (at / "name").fail("refers to '" + v->name + "', a symbolic integer, where a tensor belongs");
    return v;
  }

  Value* optional_tensor(const ex::OptionalTensorArgument& t, const RecordField& at) {
    return t.tag() == ex::OptionalTensorArgument::Tag::AS_NONE ? nullptr : tensor_ref(t.get_as_tensor(), at / "as_tensor");
  }

  SymSize sym_size(const ex::SymIntArgument& s, const RecordField& at) {
    if (s.tag() == ex::SymIntArgument::Tag::AS_INT) return {s.get_as_int(), nullptr};
    return {0, symbol_named(s.get_as_name(), at / "as_name")};
  }

  // One argument, shaped by the schema argument it is passed for (nullptr: integer operators and graph
  // outputs).
  Arg argument(const ex::Argument& a, const RecordField& at, const c10::Argument* schema) {
    using Tag = ex::Argument::Tag;
    const bool tensor_arg = schema && takes_tensor(*schema);
    const RecordField value = at / kind_name(ex::printEnum(a.tag()));
    switch (a.tag()) {
      case Tag::AS_NONE: return Arg::of(c10::IValue());
      case Tag::AS_TENSOR:
      case Tag::AS_OPTIONAL_TENSOR:
      case Tag::AS_TENSORS:
      case Tag::AS_OPTIONAL_TENSORS: return tensors_argument(a, value, schema);
      case Tag::AS_INT: return number(c10::IValue(a.get_as_int()), tensor_arg);
      case Tag::AS_FLOAT: return number(c10::IValue(a.get_as_float().get()), tensor_arg);
      case Tag::AS_BOOL: return number(c10::IValue(a.get_as_bool()), tensor_arg);
      case Tag::AS_INTS:
      case Tag::AS_FLOATS:
      case Tag::AS_BOOLS:
      case Tag::AS_STRING:
      case Tag::AS_STRINGS: return constant_argument(a);
      case Tag::AS_SYM_INT:
      case Tag::AS_SYM_INTS: return sizes_argument(a, value, tensor_arg);
      case Tag::AS_SCALAR_TYPE:
      case Tag::AS_LAYOUT:
      case Tag::AS_MEMORY_FORMAT:
      case Tag::AS_DEVICE: return enum_argument(a, value);
      default: at.fail("unsupported argument kind '" + kind_name(ex::printEnum(a.tag())) + "'");
    }
  }

  // A tensor, an optional one, or a list of either.
  Arg tensors_argument(const ex::Argument& a, const RecordField& value, const c10::Argument* schema) {
    using Tag = ex::Argument::Tag;
    if (a.tag() == Tag::AS_TENSOR) return Arg::tensor(tensor_ref(a.get_as_tensor(), value));
    if (a.tag() == Tag::AS_OPTIONAL_TENSOR) {
      Value* v = optional_tensor(a.get_as_optional_tensor(), value);
      return v ? Arg::tensor(v) : Arg::of(c10::IValue());
    }
    if (a.tag() == Tag::AS_TENSORS) {
      Arg out{schema && takes_optional_tensor_list(*schema) ? Arg::Kind::OptionalTensors : Arg::Kind::Tensors};
      for (size_t i = 0; i < a.get_as_tensors().size(); ++i) out.values.push_back(tensor_ref(a.get_as_tensors()[i], value / i));
      return out;
    }
    Arg out{Arg::Kind::OptionalTensors};
    for (size_t i = 0; i < a.get_as_optional_tensors().size(); ++i)
      out.values.push_back(optional_tensor(a.get_as_optional_tensors()[i], value / i));
    return out;
  }

  // Lists of numbers, strings.
  static Arg constant_argument(const ex::Argument& a) {
    using Tag = ex::Argument::Tag;
    switch (a.tag()) {
      case Tag::AS_INTS: return Arg::of(a.get_as_ints());
      case Tag::AS_FLOATS: {
        std::vector<double> out;
        for (const ex::F64& x : a.get_as_floats()) out.push_back(x.get());
        return Arg::of(out);
      }
      case Tag::AS_BOOLS: {
        c10::List<bool> bools;
        for (const bool b : a.get_as_bools()) bools.push_back(b);
        return Arg::of(bools);
      }
      case Tag::AS_STRING: return Arg::of(a.get_as_string());
      default: return Arg::of(c10::List<std::string>(a.get_as_strings()));
    }
  }

  // A symbolic size, or a list of them.
  Arg sizes_argument(const ex::Argument& a, const RecordField& value, bool tensor_arg) {
    if (a.tag() == ex::Argument::Tag::AS_SYM_INT) {
      Arg out{Arg::Kind::SymInt};
      out.sizes.push_back(sym_size(a.get_as_sym_int(), value));
      out.tensor_number = tensor_arg;
      return out;
    }
    Arg out{Arg::Kind::SymInts};
    for (size_t i = 0; i < a.get_as_sym_ints().size(); ++i) out.sizes.push_back(sym_size(a.get_as_sym_ints()[i], value / i));
    return out;
  }

  // A dtype, layout, memory format or device, each from its serialized code.
  static Arg enum_argument(const ex::Argument& a, const RecordField& value) {
    using Tag = ex::Argument::Tag;
    switch (a.tag()) {
      case Tag::AS_SCALAR_TYPE: return Arg::of(dtype_of(static_cast<int64_t>(a.get_as_scalar_type()), value));
      case Tag::AS_LAYOUT: {
        const auto layout = layout_from_serialized(static_cast<int64_t>(a.get_as_layout()));
        if (!layout) value.fail("unsupported layout code " + std::to_string(static_cast<int64_t>(a.get_as_layout())));
        return Arg::of(*layout);
      }
      case Tag::AS_MEMORY_FORMAT: {
        const auto format = memory_format_from_serialized(static_cast<int64_t>(a.get_as_memory_format()));
        if (!format) value.fail("unsupported memory format code " + std::to_string(static_cast<int64_t>(a.get_as_memory_format())));
        return Arg::of(*format);
      }
      default: return Arg::of(device_of(a.get_as_device(), value));
    }
  }

  static Arg number(c10::IValue number, bool tensor_arg) { return tensor_arg ? Arg{Arg::Kind::Number, std::move(number)} : Arg::of(std::move(number)); }

  static c10::Device device_of(const ex::Device& d, const RecordField& at) {
    const std::string& type = d.get_type();
    const auto& index = d.get_index();
    if (index && (*index < 0 || *index > std::numeric_limits<c10::DeviceIndex>::max()))
      (at / "index").fail("expected a device index in [0, " + std::to_string(std::numeric_limits<c10::DeviceIndex>::max()) + "], found " +
                          std::to_string(*index));
    try {
      return c10::Device(type + (index ? ":" + std::to_string(*index) : ""));
    } catch (const c10::Error&) {
      (at / "type").fail("'" + type.substr(0, 40) + "' is not a device type LibTorch knows");
    }
  }

  // A value the file defines (a graph input, or a node output), with its meta.
  Value* define(const std::string& name, const RecordField& at, Value::Kind kind, bool graph_input = false) {
    if (name.empty()) at.fail("an empty value name");
    if (program_.graph.find_value(name)) at.fail("the name '" + name.substr(0, 200) + "' is defined twice");
    Value* v = graph_input ? program_.graph.add_input(name, kind) : program_.graph.new_value(name, kind);
    if (kind == Value::Kind::Tensor) {
      const auto meta = graph_.get_tensor_values().find(name);
      if (meta == graph_.get_tensor_values().end()) at.fail("no tensor_values entry for '" + name.substr(0, 200) + "'");
      read_tensor_meta(meta->second, field_ / "tensor_values" / name, *v);
    } else if (const auto sym = graph_.get_sym_int_values().find(name); sym != graph_.get_sym_int_values().end()) {
      const auto [hint, expr] = sym_int(sym->second, field_ / "sym_int_values" / name);
      v->sym_hint = hint;
      v->sym_expr = expr;
    }
    return v;
  }

  std::vector<Arg> call_arguments(const ex::Node& n, const RecordField& at, const Node& node) {
    const auto& schema = node.op->schema();
    std::vector<std::optional<Arg>> args(schema.arguments().size());
    const RecordField inputs = at / "inputs";
    for (size_t i = 0; i < n.get_inputs().size(); ++i) {
      const ex::NamedArgument& a = n.get_inputs()[i];
      const RecordField input = inputs / i;
      const std::string& arg_name = a.get_name();
      const auto index = schema.argumentIndexWithName(arg_name);
      if (!index) (input / "name").fail(schema.name() + " has no argument '" + arg_name.substr(0, 80) + "'");
      if (args[*index]) (input / "name").fail("the argument '" + arg_name + "' is given twice");
      args[*index] = argument(a.get_arg(), input / "arg", &schema.arguments()[*index]);
      const auto& kind = a.get_kind();
      if (kind && (*kind < 0 || *kind > 2)) (input / "kind").fail("expected an argument kind in [0, 2], found " + std::to_string(*kind));
      args[*index]->keyword = kind && *kind == static_cast<int64_t>(ex::ArgumentKind::KEYWORD);
    }
    std::vector<Arg> out;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i]) {
        out.push_back(std::move(*args[i]));
        continue;
      }
      const auto& a = schema.arguments()[i];
      if (!a.default_value()) inputs.fail("the required argument '" + a.name() + "' is missing");
      Arg d = Arg::of(*a.default_value());
      d.given = false;
      d.keyword = a.kwarg_only();
      out.push_back(std::move(d));
    }
    return out;
  }

  // Python's integer operators on sizes: each operand an integer or a symbolic integer; which
  // operators and what constant operands are valid is integer_ops' business.
  std::vector<Arg> integer_operator_arguments(const ex::Node& n, const RecordField& at, const Node& node) {
    std::vector<Arg> out;
    std::vector<std::optional<int64_t>> constants;
    for (size_t i = 0; i < n.get_inputs().size(); ++i) {
      const RecordField input = at / "inputs" / i / "arg";
      Arg arg = argument(n.get_inputs()[i].get_arg(), input, nullptr);
      const bool integer = arg.kind == Arg::Kind::SymInt || (arg.kind == Arg::Kind::Constant && arg.constant.isInt());
      if (!integer) input.fail("an operand of " + node.target + " must be an integer or a symbolic integer");
      constants.push_back(arg.kind == Arg::Kind::Constant ? std::optional<int64_t>(arg.constant.toInt()) : std::nullopt);
      out.push_back(std::move(arg));
    }
    const std::string problem = integer_operator_problem(node.target, constants);
    if (!problem.empty()) (at / "target").fail(problem);
    return out;
  }

  static void resolve_target(const RecordField& at, Node& node) {
    const std::string prefix = "torch.ops.";
    if (node.target.rfind("_operator.", 0) == 0) return;
    if (node.target.rfind(prefix, 0) != 0)
      at.fail("unsupported kind of node '" + node.target.substr(0, 200) + "' (only torch.ops.* and _operator.* calls)");
    // torch.ops.<ns>.<op>.<overload>, overload "default" meaning the unnamed one.
    const std::string rest = node.target.substr(prefix.size());
    const auto ns_end = rest.find('.'), op_end = rest.rfind('.');
    if (ns_end == std::string::npos || op_end == ns_end) at.fail("cannot parse '" + node.target.substr(0, 200) + "'");
    const std::string name = rest.substr(0, ns_end) + "::" + rest.substr(ns_end + 1, op_end - ns_end - 1);
    std::string overload = rest.substr(op_end + 1);
    if (overload == "default") overload.clear();
    auto op = c10::Dispatcher::singleton().findSchema({name, overload});
    if (!op) at.fail("the op " + node.target.substr(0, 200) + " is unknown to the ATen dispatcher of this LibTorch");
    node.op = *op;
  }

  void outputs(const ex::Node& n, const RecordField& at, Node& node) {
    using Tag = ex::Argument::Tag;
    for (size_t i = 0; i < n.get_outputs().size(); ++i) {
      const ex::Argument& o = n.get_outputs()[i];
      const RecordField out = at / "outputs" / i;
      if (o.tag() == Tag::AS_TENSOR) {
        node.outputs.push_back(define(o.get_as_tensor().get_name(), out / "as_tensor" / "name", Value::Kind::Tensor));
      } else if (o.tag() == Tag::AS_SYM_INT) {
        const ex::SymIntArgument& s = o.get_as_sym_int();
        if (s.tag() != ex::SymIntArgument::Tag::AS_NAME) (out / "as_sym_int").fail("a symbolic integer output must be named (as_name)");
        node.outputs.push_back(define(s.get_as_name(), out / "as_sym_int" / "as_name", Value::Kind::SymInt));
      } else if (o.tag() == Tag::AS_TENSORS) {
        for (size_t k = 0; k < o.get_as_tensors().size(); ++k)
          node.outputs.push_back(define(o.get_as_tensors()[k].get_name(), out / "as_tensors" / k / "name", Value::Kind::Tensor));
      } else if (o.tag() != Tag::AS_NONE) {
        out.fail("unsupported output kind '" + kind_name(ex::printEnum(o.tag())) + "'");
      }
    }
    if (!node.op && (node.outputs.size() != 1 || node.outputs[0]->is_tensor()))
      (at / "outputs").fail("an integer operator has exactly one symbolic integer output");
  }

  void node(const ex::Node& n, const RecordField& at) {
    auto node = std::make_unique<Node>();
    node->name = n.get_name().value_or("");
    node->target = n.get_target();
    for (const auto& [key, value] : n.get_metadata()) node->metadata[key] = value;
    if (node->metadata.count("nn_module_stack")) module_of(node->metadata["nn_module_stack"], *node);

    resolve_target(at / "target", *node);
    std::vector<Arg> args = node->op ? call_arguments(n, at, *node) : integer_operator_arguments(n, at, *node);
    outputs(n, at, *node);
    if (node->name.empty()) node->name = node->outputs.empty() ? node->target : node->outputs[0]->name;
    program_.graph.append(std::move(node), std::move(args));
  }

  Program& program_;
  const ex::Graph& graph_;
  const RecordField field_;
};

}  // namespace

void read_tensor_meta(const ex::TensorMeta& meta, const RecordField& field, Value& v) {
  v.meta.dtype = dtype_of(static_cast<int64_t>(meta.get_dtype()), field / "dtype");
  for (size_t i = 0; i < meta.get_sizes().size(); ++i) {
    auto [size, expr] = sym_int(meta.get_sizes()[i], field / "sizes" / i);
    v.meta.shape.push_back(size);
    v.symbolic_sizes.push_back(expr);
  }
  for (size_t i = 0; i < meta.get_strides().size(); ++i) {
    auto [stride, expr] = sym_int(meta.get_strides()[i], field / "strides" / i);
    v.meta.stride.push_back(stride);
    v.symbolic_strides.push_back(expr);
  }
  if (v.meta.stride.size() != v.meta.shape.size())
    (field / "strides").fail(std::to_string(v.meta.stride.size()) + " strides for " + std::to_string(v.meta.shape.size()) + " sizes");
  v.storage_offset = sym_int(meta.get_storage_offset(), field / "storage_offset").first;
  const auto extent = io::checked_extent(v.meta.shape, v.meta.stride);
  if (!io::checked_numel(v.meta.shape) || !extent || !io::checked_add(*extent, v.storage_offset))
    field.fail("its sizes, strides and storage offset overflow a 64-bit element count");
  v.requires_grad = meta.get_requires_grad();
  if (layout_from_serialized(static_cast<int64_t>(meta.get_layout())) != c10::kStrided)
    (field / "layout").fail("only strided tensors are supported");
}

void read_graph(const ex::Graph& graph, const RecordField& field, Program& program) { GraphReader(program, graph, field).read(); }

}  // namespace dtensor::graph::detail
