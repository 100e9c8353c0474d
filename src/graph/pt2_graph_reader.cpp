#include "pt2_graph_reader.h"

#include <limits>

#include "../io/checked_int.h"
#include "dtensor/errors.h"
#include "integer_ops.h"
#include "serialized_enums.h"

namespace dtensor::graph::detail {
namespace {

using io::JsonField;

// A SymInt union (sizes, strides, offsets: never negative): its example value, and its sympy
// expression when dynamic ("" when static).
std::pair<int64_t, std::string> sym_int(const JsonField& j) {
  const auto [kind, v] = j.only_member();
  if (kind == "as_int") return {v.as_int(0), ""};
  if (kind == "as_expr") {
    const std::string& expr = v.at("expr_str").as_string();
    if (expr.empty()) v.at("expr_str").fail("an empty expression");
    const auto hint = v.find("hint");
    if (!hint || hint->is_null()) v.fail("a dynamic size without an example value (hint)");
    const auto [hint_kind, value] = hint->only_member();
    if (hint_kind != "as_int") hint->fail("expected an integer example value (as_int), found '" + hint_kind + "'");
    return {value.as_int(0), expr};
  }
  j.fail("unsupported SymInt kind '" + kind + "'");
}

c10::ScalarType dtype_of(const JsonField& j) {
  const auto type = scalar_type_from_serialized(j.as_int());
  if (!type) j.fail("unsupported dtype code " + std::to_string(j.as_int()));
  return *type;
}

// A float argument: a number, or the strings torch.export writes for the values JSON lacks.
double float_of(const JsonField& j) {
  if (j.json().is_string()) {
    const std::string& s = j.as_string();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    j.fail("expected a number, Infinity, -Infinity or NaN, found " + j.found());
  }
  return j.as_number();
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
  GraphReader(Program& program, const JsonField& graph)
      : program_(program), graph_(graph), tensor_values_(graph.at("tensor_values")) {
    if (const auto sym = graph.find("sym_int_values")) sym_int_values_ = *sym;
    tensor_values_.members();  // an object, or an error naming it
  }

  void read() {
    for (const JsonField& in : graph_.at("inputs").elements()) {
      const auto [kind, v] = in.only_member();
      if (kind == "as_tensor") define(v.at("name"), Value::Kind::Tensor, true);
      else if (kind == "as_sym_int") define(v.at("as_name"), Value::Kind::SymInt, true);
      else in.fail("unsupported input kind '" + kind + "'");
    }
    for (const JsonField& n : graph_.at("nodes").elements()) node(n);
    for (const JsonField& out : graph_.at("outputs").elements()) program_.graph.outputs().push_back(argument(out, nullptr));
  }

 private:
  Value* tensor_named(const JsonField& name) {
    Value* v = program_.graph.find_value(name.as_string());
    if (!v) name.fail("refers to '" + name.as_string() + "', which no earlier node or input defines");
    return v;
  }

  Value* symbol_named(const JsonField& name) {
    Value* v = tensor_named(name);
    if (v->is_tensor()) name.fail("refers to '" + v->name + "', a tensor, where a symbolic integer belongs");
    return v;
  }

  Value* tensor_ref(const JsonField& ref) {
    Value* v = tensor_named(ref.at("name"));
    if (!v->is_tensor()) ref.at("name").fail("refers to '" + v->name + "', a symbolic integer, where a tensor belongs");
    return v;
  }

  SymSize sym_size(const JsonField& j) {
    const auto [kind, v] = j.only_member();
    if (kind == "as_int") return {v.as_int(), nullptr};
    if (kind == "as_name") return {0, symbol_named(v)};
    j.fail("unsupported SymIntArgument kind '" + kind + "'");
  }

  Arg tensors(const std::string& kind, const JsonField& v, bool optional) {
    Arg a{optional ? Arg::Kind::OptionalTensors : Arg::Kind::Tensors};
    for (const JsonField& t : v.elements()) {
      if (kind == "as_tensors") {
        a.values.push_back(tensor_ref(t));
        continue;
      }
      const auto [k, x] = t.only_member();
      a.values.push_back(k == "as_none" ? nullptr : tensor_ref(x));
    }
    return a;
  }

  // One argument, shaped by the schema argument it is passed for (nullptr: integer operators and graph
  // outputs).
  Arg argument(const JsonField& j, const c10::Argument* schema) {
    const auto [kind, v] = j.only_member();
    const bool tensor_arg = schema && takes_tensor(*schema);
    if (kind == "as_none") return Arg::of(c10::IValue());
    if (kind == "as_tensor") return Arg::tensor(tensor_ref(v));
    if (kind == "as_optional_tensor") {
      const auto [k, t] = v.only_member();
      return k == "as_none" ? Arg::of(c10::IValue()) : Arg::tensor(tensor_ref(t));
    }
    if (kind == "as_tensors" || kind == "as_optional_tensors")
      return tensors(kind, v, kind == "as_optional_tensors" || (schema && takes_optional_tensor_list(*schema)));
    if (kind == "as_int" || kind == "as_float" || kind == "as_bool") {
      const c10::IValue number = kind == "as_int" ? c10::IValue(v.as_int())
                                 : kind == "as_float" ? c10::IValue(float_of(v))
                                                      : c10::IValue(v.as_bool());
      return tensor_arg ? Arg{Arg::Kind::Number, number} : Arg::of(number);
    }
    if (kind == "as_ints") return Arg::of(v.as_ints());
    if (kind == "as_floats") {
      std::vector<double> out;
      for (const JsonField& x : v.elements()) out.push_back(float_of(x));
      return Arg::of(out);
    }
    if (kind == "as_bools") {
      c10::List<bool> bools;
      for (const JsonField& b : v.elements()) bools.push_back(b.as_bool());
      return Arg::of(bools);
    }
    if (kind == "as_string") return Arg::of(v.as_string());
    if (kind == "as_strings") {
      c10::List<std::string> strings;
      for (const JsonField& x : v.elements()) strings.push_back(x.as_string());
      return Arg::of(strings);
    }
    if (kind == "as_sym_int") {
      Arg a{Arg::Kind::SymInt};
      a.sizes.push_back(sym_size(v));
      a.tensor_number = tensor_arg;
      return a;
    }
    if (kind == "as_sym_ints") {
      Arg a{Arg::Kind::SymInts};
      for (const JsonField& s : v.elements()) a.sizes.push_back(sym_size(s));
      return a;
    }
    if (kind == "as_scalar_type") return Arg::of(dtype_of(v));
    if (kind == "as_layout") {
      const auto layout = layout_from_serialized(v.as_int());
      if (!layout) v.fail("unsupported layout code " + std::to_string(v.as_int()));
      return Arg::of(*layout);
    }
    if (kind == "as_memory_format") {
      const auto format = memory_format_from_serialized(v.as_int());
      if (!format) v.fail("unsupported memory format code " + std::to_string(v.as_int()));
      return Arg::of(*format);
    }
    if (kind == "as_device") return Arg::of(device_of(v));
    j.fail("unsupported argument kind '" + kind + "'");
  }

  static c10::Device device_of(const JsonField& v) {
    const std::string& type = v.at("type").as_string();
    const auto index = v.find("index");
    const bool indexed = index && !index->is_null();
    const int64_t i = indexed ? index->as_int(0, std::numeric_limits<c10::DeviceIndex>::max()) : -1;
    try {
      return c10::Device(type + (indexed ? ":" + std::to_string(i) : ""));
    } catch (const c10::Error&) {
      v.at("type").fail("'" + type.substr(0, 40) + "' is not a device type LibTorch knows");
    }
  }

  // A value the file defines (a graph input, or a node output), with its meta.
  Value* define(const JsonField& name_field, Value::Kind kind, bool graph_input = false) {
    const std::string& name = name_field.as_string();
    if (name.empty()) name_field.fail("an empty value name");
    if (program_.graph.find_value(name)) name_field.fail("the name '" + name + "' is defined twice");
    Value* v = graph_input ? program_.graph.add_input(name, kind) : program_.graph.new_value(name, kind);
    if (kind == Value::Kind::Tensor) {
      const auto meta = tensor_values_.find(name);
      if (!meta) name_field.fail("no tensor_values entry for '" + name + "'");
      read_tensor_meta(*meta, *v);
    } else if (sym_int_values_) {
      if (const auto sym = sym_int_values_->find(name)) {
        const auto [hint, expr] = sym_int(*sym);
        v->sym_hint = hint;
        v->sym_expr = expr;
      }
    }
    return v;
  }

  void call_arguments(const JsonField& n, Node& node) {
    const auto& schema = node.op->schema();
    std::vector<std::optional<Arg>> args(schema.arguments().size());
    for (const JsonField& a : n.at("inputs").elements()) {
      const std::string& arg_name = a.at("name").as_string();
      const auto index = schema.argumentIndexWithName(arg_name);
      if (!index) a.at("name").fail(schema.name() + " has no argument '" + arg_name + "'");
      if (args[*index]) a.at("name").fail("the argument '" + arg_name + "' is given twice");
      args[*index] = argument(a.at("arg"), &schema.arguments()[*index]);
      const auto keyword = a.find("kind");
      args[*index]->keyword = keyword && keyword->as_int(0, 2) == 2;
    }
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i]) {
        node.args.push_back(std::move(*args[i]));
        continue;
      }
      const auto& a = schema.arguments()[i];
      if (!a.default_value()) n.at("inputs").fail("the required argument '" + a.name() + "' is missing");
      Arg d = Arg::of(*a.default_value());
      d.given = false;
      d.keyword = a.kwarg_only();
      node.args.push_back(std::move(d));
    }
  }

  // Python's integer operators on sizes: each operand an integer or a symbolic integer; which
  // operators and what constant operands are valid is integer_ops' business.
  void integer_operator_arguments(const JsonField& n, Node& node) {
    std::vector<std::optional<int64_t>> constants;
    for (const JsonField& a : n.at("inputs").elements()) {
      Arg arg = argument(a.at("arg"), nullptr);
      const bool integer = arg.kind == Arg::Kind::SymInt || (arg.kind == Arg::Kind::Constant && arg.constant.isInt());
      if (!integer) a.at("arg").fail("an operand of " + node.target + " must be an integer or a symbolic integer");
      constants.push_back(arg.kind == Arg::Kind::Constant ? std::optional<int64_t>(arg.constant.toInt()) : std::nullopt);
      node.args.push_back(std::move(arg));
    }
    const std::string problem = integer_operator_problem(node.target, constants);
    if (!problem.empty()) n.at("target").fail(problem);
  }

  void resolve_target(const JsonField& target_field, Node& node) {
    const std::string prefix = "torch.ops.";
    if (node.target.rfind("_operator.", 0) == 0) return;
    if (node.target.rfind(prefix, 0) != 0)
      target_field.fail("unsupported kind of node '" + node.target + "' (only torch.ops.* and _operator.* calls)");
    // torch.ops.<ns>.<op>.<overload>, overload "default" meaning the unnamed one.
    const std::string rest = node.target.substr(prefix.size());
    const auto ns_end = rest.find('.'), op_end = rest.rfind('.');
    if (ns_end == std::string::npos || op_end == ns_end) target_field.fail("cannot parse '" + node.target + "'");
    const std::string name = rest.substr(0, ns_end) + "::" + rest.substr(ns_end + 1, op_end - ns_end - 1);
    std::string overload = rest.substr(op_end + 1);
    if (overload == "default") overload.clear();
    auto op = c10::Dispatcher::singleton().findSchema({name, overload});
    if (!op) target_field.fail("the op " + node.target + " is unknown to the ATen dispatcher of this LibTorch");
    node.op = *op;
  }

  void outputs(const JsonField& n, Node& node) {
    for (const JsonField& o : n.at("outputs").elements()) {
      const auto [kind, v] = o.only_member();
      if (kind == "as_tensor") node.outputs.push_back(define(v.at("name"), Value::Kind::Tensor));
      else if (kind == "as_sym_int") node.outputs.push_back(define(v.at("as_name"), Value::Kind::SymInt));
      else if (kind == "as_tensors")
        for (const JsonField& t : v.elements()) node.outputs.push_back(define(t.at("name"), Value::Kind::Tensor));
      else if (kind != "as_none") o.fail("unsupported output kind '" + kind + "'");
    }
    if (!node.op && (node.outputs.size() != 1 || node.outputs[0]->is_tensor()))
      n.at("outputs").fail("an integer operator has exactly one symbolic integer output");
  }

  void node(const JsonField& n_at_index) {
    auto node = std::make_unique<Node>();
    const auto name = n_at_index.find("name");
    node->name = name && !name->is_null() ? name->as_string() : "";
    // Fields of a node are named from the node ("...: node 'addmm_3': field 'inputs[1].arg'"), or
    // from its place in the list when it has no name.
    const std::string where = n_at_index.where() + (node->name.empty() ? ": field '" + n_at_index.path() + "'" : ": node '" + node->name.substr(0, 200) + "'");
    const JsonField n(n_at_index.json(), where);
    node->target = n.at("target").as_string();
    if (const auto metadata = n.find("metadata"))
      for (const auto& [k, v] : metadata->members())
        if (v.json().is_string()) node->metadata[k] = v.as_string();
    if (node->metadata.count("nn_module_stack")) module_of(node->metadata["nn_module_stack"], *node);

    resolve_target(n.at("target"), *node);
    if (node->op) call_arguments(n, *node);
    else integer_operator_arguments(n, *node);
    outputs(n, *node);
    if (node->name.empty()) node->name = node->outputs.empty() ? node->target : node->outputs[0]->name;
    program_.graph.append(std::move(node));
  }

  Program& program_;
  const JsonField& graph_;
  JsonField tensor_values_;
  std::optional<JsonField> sym_int_values_;
};

}  // namespace

void read_tensor_meta(const JsonField& m, Value& v) {
  v.meta.dtype = dtype_of(m.at("dtype"));
  for (const JsonField& s : m.at("sizes").elements()) {
    auto [size, expr] = sym_int(s);
    v.meta.shape.push_back(size);
    v.symbolic_sizes.push_back(expr);
  }
  for (const JsonField& s : m.at("strides").elements()) {
    auto [stride, expr] = sym_int(s);
    v.meta.stride.push_back(stride);
    v.symbolic_strides.push_back(expr);
  }
  if (v.meta.stride.size() != v.meta.shape.size())
    m.at("strides").fail(std::to_string(v.meta.stride.size()) + " strides for " + std::to_string(v.meta.shape.size()) + " sizes");
  v.storage_offset = sym_int(m.at("storage_offset")).first;
  const auto extent = io::checked_extent(v.meta.shape, v.meta.stride);
  if (!io::checked_numel(v.meta.shape) || !extent || !io::checked_add(*extent, v.storage_offset))
    m.fail("its sizes, strides and storage offset overflow a 64-bit element count");
  if (const auto requires_grad = m.find("requires_grad")) v.requires_grad = requires_grad->as_bool();
  if (const auto layout_field = m.find("layout")) {
    const auto layout = layout_from_serialized(layout_field->as_int());
    if (layout != c10::kStrided) layout_field->fail("only strided tensors are supported");
  }
}

void read_graph(const JsonField& graph, Program& program) { GraphReader(program, graph).read(); }

}  // namespace dtensor::graph::detail
