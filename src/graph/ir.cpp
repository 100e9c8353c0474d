#include "dtensor/graph/ir.h"

#include <algorithm>
#include <sstream>

#include <ATen/ScalarOps.h>

#include "../sharding/for_graph.h"
#include "dtensor/errors.h"

namespace dtensor::graph {

at::Tensor wrapped_number(const c10::Scalar& number) {
  at::Tensor t = c10::scalar_to_tensor(number);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}


Arg Arg::ints(const std::vector<int64_t>& v) { return Arg::of(c10::IValue(v)); }

bool Value::is_graph_output() const {
  return std::any_of(uses_.begin(), uses_.end(), [](const Node* n) { return n->is_output(); });
}

void copy_provenance(const Node& from, Node& to) {
  to.metadata = from.metadata;
  to.module_path = from.module_path;
  to.module_type = from.module_type;
}

std::string Node::op_name() const {
  if (!op) return target;
  const auto& name = op->operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

std::vector<Value*> Node::inputs() const {
  std::vector<Value*> out;
  for (const Arg& a : args_) {
    for (Value* v : a.values)
      if (v) out.push_back(v);
    for (const SymSize& s : a.sizes)
      if (s.symbol) out.push_back(s.symbol);
  }
  return out;
}

Graph::Graph() : output_(std::make_unique<Node>()) {
  output_->name = output_->target = "output";
  output_->is_output_ = true;
}

// Values and nodes share one namespace: a saved program names a call of several outputs apart from its
// outputs, and torch.export.load refuses a name given twice.
std::string Graph::unique_name(const std::string& name) {
  const auto taken = [&](const std::string& n) { return by_name_.count(n) > 0 || node_names_.count(n) > 0; };
  if (!taken(name)) return name;
  for (int k = 1;; ++k) {
    std::string candidate = name + "_" + std::to_string(k);
    if (!taken(candidate)) return candidate;
  }
}

Value* Graph::new_value(const std::string& name, Value::Kind kind) {
  auto v = std::make_unique<Value>();
  v->name = unique_name(name);
  v->id = values_.size();
  v->kind = kind;
  Value* raw = v.get();
  by_name_[raw->name] = raw;
  values_.push_back(std::move(v));
  return raw;
}

Value* Graph::add_input(const std::string& name, Value::Kind kind) {
  Value* v = new_value(name, kind);
  inputs_.push_back(v);
  return v;
}

Value* Graph::find_value(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<Node*> Graph::nodes() const {
  std::vector<Node*> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_) out.push_back(n.get());
  return out;
}

std::list<std::unique_ptr<Node>>::iterator Graph::position(const Node* node) {
  if (node == nullptr) return nodes_.end();
  auto it = where_.find(node);
  if (it == where_.end()) throw DTensorError("graph: node " + node->name + " is not in this graph");
  return it->second;
}

void Graph::link(Node* node) {
  for (Value* v : node->inputs()) v->uses_.push_back(node);
}

void Graph::unlink(Node* node) {
  for (Value* v : node->inputs()) {
    auto it = std::find(v->uses_.begin(), v->uses_.end(), node);
    if (it != v->uses_.end()) v->uses_.erase(it);
  }
}

Node* Graph::place(std::list<std::unique_ptr<Node>>::iterator at, std::unique_ptr<Node> node) {
  Node* raw = node.get();
  raw->id = next_node_id_++;
  node_names_.insert(raw->name);
  for (Value* out : raw->outputs) out->producer_ = raw;
  link(raw);
  where_[raw] = nodes_.insert(at, std::move(node));
  return raw;
}

namespace {

// The op for "ns::name.overload" (or "ns::name", the default overload).
c10::OperatorHandle find_op(const std::string& qualified) {
  auto op = dtensor::detail::operator_named(qualified);
  if (!op) throw DTensorError("graph: no op " + qualified + " in the dispatcher");
  return *op;
}

// "torch.ops.ns.name.overload" as torch.export writes targets ("default" for the unnamed overload).
std::string target_of(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  std::string name = n.name;
  name.replace(name.find("::"), 2, ".");
  return "torch.ops." + name + "." + (n.overload_name.empty() ? "default" : n.overload_name);
}

}  // namespace

Node* Graph::insert(Node* before, const std::string& qualified, std::vector<Arg> args, const std::string& name) {
  auto node = std::make_unique<Node>();
  node->op = find_op(qualified);
  node->target = target_of(*node->op);
  const auto& schema = node->op->schema();
  if (args.size() > schema.arguments().size())
    throw DTensorError("graph: " + qualified + " takes " + std::to_string(schema.arguments().size()) +
                       " arguments, not " + std::to_string(args.size()));
  for (size_t i = args.size(); i < schema.arguments().size(); ++i) {
    const auto& a = schema.arguments()[i];
    if (!a.default_value())
      throw DTensorError("graph: " + qualified + " needs its argument '" + a.name() + "' (it has no default)");
    Arg d = Arg::of(*a.default_value());
    d.given = false;
    args.push_back(std::move(d));
  }
  node->args_ = std::move(args);
  node->name = unique_name(name);
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    const bool is_int = schema.returns()[r].type()->kind() == c10::TypeKind::IntType ||
                        schema.returns()[r].type()->kind() == c10::TypeKind::SymIntType;
    // One output takes the node's name (FX's convention); several are named apart from it, as a
    // saved program's getitems are nodes of their own beside the call.
    const bool single = schema.returns().size() == 1;
    Value* out = new_value(single ? node->name : node->name + "_" + std::to_string(r), is_int ? Value::Kind::SymInt : Value::Kind::Tensor);
    node->outputs.push_back(out);
  }
  return place(position(before), std::move(node));
}

Node* Graph::insert_after(Node* after, const std::string& qualified, std::vector<Arg> args, const std::string& name) {
  auto it = position(after);
  Node* next = std::next(it) == nodes_.end() ? nullptr : std::next(it)->get();
  return insert(next, qualified, std::move(args), name);
}

Node* Graph::insert_integer_operator(Node* before, const std::string& op, std::vector<Arg> args, const std::string& name) {
  auto node = std::make_unique<Node>();
  node->target = "_operator." + op;
  node->args_ = std::move(args);
  node->name = unique_name(name);
  node->outputs.push_back(new_value(node->name, Value::Kind::SymInt));
  return place(position(before), std::move(node));
}

Node* Graph::append(std::unique_ptr<Node> node, std::vector<Arg> args) {
  node->args_ = std::move(args);
  return place(nodes_.end(), std::move(node));
}

void Graph::add_output(Arg arg) {
  unlink(output_.get());
  output_->args_.push_back(std::move(arg));
  link(output_.get());
}

namespace {

void replace_in(Arg& a, Value* from, Value* to) {
  for (Value*& v : a.values)
    if (v == from) v = to;
  for (SymSize& s : a.sizes)
    if (s.symbol == from) s.symbol = to;
}

}  // namespace

void Graph::replace_all_uses(Value* from, Value* to, const Node* except) {
  for (Node* n : users(from)) {
    if (n == except) continue;
    unlink(n);
    for (Arg& a : n->args_) replace_in(a, from, to);
    link(n);
  }
}

void Graph::set_arg(Node* node, size_t index, Arg arg) {
  if (node != output_.get()) position(node);  // this graph's
  if (index >= node->args_.size())
    throw DTensorError("graph: node " + node->name + " has " + std::to_string(node->args_.size()) + " arguments, not " +
                       std::to_string(index + 1));
  unlink(node);
  node->args_[index] = std::move(arg);
  link(node);
}

std::vector<Node*> Graph::users(const Value* v) const {
  std::vector<Node*> out;
  for (Node* n : v->uses_)
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  return out;
}

std::string Graph::verify() const {
  // Arrays by Value::id, not sets: the pipeline runs this after every pass on graphs of 10^4 nodes.
  std::vector<char> defined(values_.size(), 0);
  std::vector<size_t> reads(values_.size(), 0);
  for (const Value* v : inputs_) defined[v->id] = 1;
  auto read_by = [&](const Node& n) {
    for (const Value* v : n.inputs()) {
      if (!defined[v->id]) return "node " + n.name + " reads %" + v->name + " before it is defined";
      ++reads[v->id];
    }
    return std::string();
  };
  for (const auto& n : nodes_) {
    if (std::string wrong = read_by(*n); !wrong.empty()) return wrong;
    for (const Value* out : n->outputs) defined[out->id] = 1;
  }
  if (std::string wrong = read_by(*output_); !wrong.empty()) return wrong;
  for (const auto& v : values_)
    if (v->uses_.size() != reads[v->id]) return "the use-list of %" + v->name + " does not match the nodes that read it";
  return "";
}

void Graph::erase(Node* node) {
  auto it = position(node);
  for (Value* out : node->outputs)
    if (!out->uses_.empty())
      throw DTensorError("graph: cannot erase node " + node->name + ": its output " + out->name + " is still used" +
                         (out->is_graph_output() ? " (the graph returns it)" : ""));
  unlink(node);
  for (Value* out : node->outputs) out->producer_ = nullptr;
  where_.erase(node);
  nodes_.erase(it);
}

std::unique_ptr<Node> Graph::copy_of(const Node& node, std::map<const Value*, Value*>& mapped) {
  auto map_arg = [&](Arg a) {
    for (Value*& v : a.values)
      if (v) v = mapped.at(v);
    for (SymSize& s : a.sizes)
      if (s.symbol) s.symbol = mapped.at(s.symbol);
    return a;
  };
  auto copy = std::make_unique<Node>();
  copy->name = unique_name(node.name);
  copy->target = node.target;
  copy->op = node.op;
  copy_provenance(node, *copy);
  for (const Arg& a : node.args_) copy->args_.push_back(map_arg(a));
  for (const Value* out : node.outputs) {
    Value* v = new_value_like(*out);
    mapped[out] = v;
    copy->outputs.push_back(v);
  }
  return copy;
}

Value* Graph::new_value_like(const Value& from) {
  Value* v = new_value(from.name, from.kind);
  const std::string name = v->name;
  const size_t id = v->id;
  *v = from;
  v->name = name;
  v->id = id;
  v->uses_.clear();  // the other graph's readers are not this graph's
  v->producer_ = nullptr;
  return v;
}

Value* Graph::add_input_like(const Value& from) {
  Value* v = new_value_like(from);
  inputs_.push_back(v);
  return v;
}

Node* Graph::append_copy(const Node& node, std::map<const Value*, Value*>& mapped) {
  for (const Value* v : node.inputs())
    if (!mapped.count(v)) throw DTensorError("graph: copying node " + node.name + ", which reads %" + v->name + ", not mapped into this graph");
  return place(nodes_.end(), copy_of(node, mapped));
}

std::vector<Value*> Graph::insert_subgraph(Node* before, const Graph& sub, const std::vector<Value*>& inputs) {
  if (inputs.size() != sub.inputs().size())
    throw DTensorError("graph: the subgraph takes " + std::to_string(sub.inputs().size()) + " inputs, not " +
                       std::to_string(inputs.size()));
  std::map<const Value*, Value*> mapped;
  for (size_t i = 0; i < inputs.size(); ++i) mapped[sub.inputs()[i]] = inputs[i];
  const auto at = position(before);
  for (const auto& n : sub.nodes_) place(at, copy_of(*n, mapped));
  std::vector<Value*> out;
  for (const Arg& a : sub.outputs())
    for (const Value* v : a.values) out.push_back(v ? mapped.at(v) : nullptr);
  return out;
}

namespace {

std::string arg_str(const Arg& a) {
  auto name = [](const Value* v) { return v ? "%" + v->name : std::string("None"); };
  auto size = [](const SymSize& s) { return s.symbol ? "%" + s.symbol->name : std::to_string(s.value); };
  std::ostringstream out;
  switch (a.kind) {
    case Arg::Kind::Constant:
    case Arg::Kind::Number: out << a.constant; break;
    case Arg::Kind::Tensor: out << name(a.values[0]); break;
    case Arg::Kind::Tensors:
    case Arg::Kind::OptionalTensors:
      out << "[";
      for (size_t i = 0; i < a.values.size(); ++i) out << (i ? ", " : "") << name(a.values[i]);
      out << "]";
      break;
    case Arg::Kind::SymInt: out << size(a.sizes[0]); break;
    case Arg::Kind::SymInts:
      out << "[";
      for (size_t i = 0; i < a.sizes.size(); ++i) out << (i ? ", " : "") << size(a.sizes[i]);
      out << "]";
      break;
  }
  return out.str();
}

}  // namespace

std::string Graph::str(const Annotations* annotations) const {
  auto placed = [&](const Value& v) { return annotations ? annotations->placements_str(v) : std::string(); };
  std::ostringstream out;
  if (annotations)
    for (const std::string& note : annotations->program_notes()) out << "# " << note << "\n";
  for (const Value* v : inputs_) {
    out << "%" << v->name << " : input";
    if (v->is_tensor()) out << " " << shape_str(v->meta.shape);
    if (const std::string p = placed(*v); !p.empty()) out << "  [" << p << "]";
    out << "\n";
  }
  for (const auto& n : nodes_) {
    std::string outs;
    for (const Value* v : n->outputs) outs += (outs.empty() ? "%" : ", %") + v->name;
    out << outs << " = " << n->op_name() << "(";
    bool first = true;
    for (const Arg& a : n->args_) {
      if (!a.given) continue;
      out << (first ? "" : ", ") << arg_str(a);
      first = false;
    }
    out << ")";
    std::string marks;
    for (const Value* v : n->outputs)
      if (v->is_tensor()) {
        const std::string p = placed(*v);
        marks += (marks.empty() ? "" : ", ") + shape_str(v->meta.shape) + (p.empty() ? "" : " " + p);
      }
    if (!marks.empty()) out << "  " << marks;
    const std::string& note = annotations ? annotations->note(*n) : std::string();
    if (!n->module_path.empty() || !note.empty())
      out << "  # " << n->module_path << (n->module_path.empty() || note.empty() ? "" : "; ") << note;
    out << "\n";
  }
  out << "return (";
  for (size_t i = 0; i < outputs().size(); ++i) out << (i ? ", " : "") << arg_str(outputs()[i]);
  out << ")\n";
  return out.str();
}

Node* InsertionScope::with_provenance(Node* node) const {
  if (origin_) copy_provenance(*origin_, *node);
  return node;
}

Node* InsertionScope::insert(const std::string& qualified, std::vector<Arg> args, const std::string& name) const {
  return with_provenance(graph_.insert(before_, qualified, std::move(args), name));
}

Node* InsertionScope::insert_integer_operator(const std::string& op, std::vector<Arg> args, const std::string& name) const {
  return with_provenance(graph_.insert_integer_operator(before_, op, std::move(args), name));
}

}  // namespace dtensor::graph
