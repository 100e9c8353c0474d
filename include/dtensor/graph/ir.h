#pragma once
// dtensor's graph IR: what an exported program (torch.export's .pt2) is once read, and what the graph
// transforms edit. Values are tensors or symbolic integers; nodes call an op (through the ATen
// dispatcher) or an integer operator on symbolic sizes, with one argument per schema argument.
//
// The editing API is what seed 000's passes do on FX graphs: insert a node before or after another,
// replace all uses of a value, erase a node, insert a whole subgraph. Values and nodes have stable
// addresses for the graph's lifetime. As in torch.fx, the graph's outputs are the arguments of an
// output node, so "is it an output" is a question about uses. A node's arguments and a value's
// use-list and producer change only through the Graph's methods, which keep them consistent.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <list>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <unordered_map>
#include <string>
#include <vector>

#include "dtensor/graph/annotations.h"
#include "dtensor/op_schema.h"
#include "dtensor/spec.h"

namespace dtensor::graph {

class Node;

class Value {
 public:
  enum class Kind { Tensor, SymInt };

  std::string name;
  // Its index among the graph's values (dense: Annotations index arrays by it). Values live as long
  // as their graph.
  size_t id = 0;
  Kind kind = Kind::Tensor;
  // Tensors: shape (dynamic dims at their example value), strides, dtype; the global tensor's until a
  // transform makes the program per rank, then the local one.
  TensorMeta meta;
  int64_t storage_offset = 0;
  bool requires_grad = false;
  // Per dim of shape / stride: the sympy expression of a dynamic size ("" where it is static), kept
  // to write the program back.
  std::vector<std::string> symbolic_sizes, symbolic_strides;
  // SymInts: the expression and its example value.
  std::string sym_expr;
  int64_t sym_hint = 0;

  bool is_tensor() const { return kind == Kind::Tensor; }
  // The node that computes it; nullptr for a graph input.
  Node* producer() const { return producer_; }
  // The nodes that read it, once per read (an argument or a size), the graph's output node included:
  // kept current by every edit the Graph makes, so users are known without a scan of the graph.
  const std::vector<Node*>& uses() const { return uses_; }
  bool is_graph_output() const;

 private:
  friend class Graph;
  Node* producer_ = nullptr;
  std::vector<Node*> uses_;
};

// A size argument: a constant, or a symbolic integer computed by the graph.
struct SymSize {
  int64_t value = 0;
  Value* symbol = nullptr;
  // The value, or the symbol's example value.
  int64_t hint() const { return symbol ? symbol->sym_hint : value; }
};

// One argument of a node, for one schema argument.
struct Arg {
  enum class Kind {
    Constant,         // any non-tensor value (numbers, lists, strings, dtypes, devices, None, ...)
    Number,           // a number where the schema takes a Tensor: a 0-d "wrapped number" at run time
    Tensor,           // values[0]
    Tensors,          // values
    OptionalTensors,  // values, nullptr for None
    SymInt,           // sizes[0]
    SymInts,          // sizes
  };
  Kind kind = Kind::Constant;
  c10::IValue constant;
  std::vector<Value*> values;
  std::vector<SymSize> sizes;
  // SymInt given for a Tensor argument (positions = arange(n) + past_length): like Number, a 0-d
  // wrapped number at run time.
  bool tensor_number = false;
  bool given = true;    // present in the file (false: filled from the schema's default)
  bool keyword = false;

  static Arg of(c10::IValue v) { return Arg{Kind::Constant, std::move(v)}; }
  static Arg tensor(Value* v) { return Arg{Kind::Tensor, {}, {v}}; }
  static Arg ints(const std::vector<int64_t>& v);
};

// A number as Python passes it for a Tensor argument: a 0-d "wrapped number", which type promotion
// treats as a scalar (int64 * 0.5 stays float32, not float64).
at::Tensor wrapped_number(const c10::Scalar& number);

class Node {
 public:
  std::string name;
  uint64_t id = 0;  // unique in its graph, never reused after the node is erased (Annotations key on it)
  // The op as the file names it: "torch.ops.aten.mm.default", "_operator.mul".
  std::string target;
  // The dispatcher's op for ops in a torch.ops namespace; empty for integer operators.
  std::optional<c10::OperatorHandle> op;
  // The values it defines, set before the node joins its graph (which makes it their producer).
  std::vector<Value*> outputs;
  // Its provenance: where in the user's model it comes from. Nodes a pass writes for it take the same
  // (InsertionScope).
  std::map<std::string, std::string> metadata;  // stack_trace, nn_module_stack, ... as read
  std::string module_path;  // the innermost module that ran it ("blocks.0.attn.wq"), "" at the root
  std::string module_type;  // its class ("torch.nn.modules.linear.Linear")

  // One per schema argument (integer operators: a, b; the output node: one per graph output).
  const std::vector<Arg>& args() const { return args_; }
  // The graph's output node: its arguments are what the graph returns. It is not among nodes().
  bool is_output() const { return is_output_; }
  // "aten::mm" / "aten::add.Tensor" for dispatcher ops, the target otherwise.
  std::string op_name() const;
  std::vector<Value*> inputs() const;  // every value it reads, in argument order

 private:
  friend class Graph;
  std::vector<Arg> args_;
  bool is_output_ = false;
};

// Copies `from`'s provenance (module path and type, metadata) onto `to`.
void copy_provenance(const Node& from, Node& to);

class Graph {
 public:
  Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  // A new value named `name` (made unique by a suffix if taken), owned by the graph.
  Value* new_value(const std::string& name, Value::Kind kind = Value::Kind::Tensor);
  Value* add_input(const std::string& name, Value::Kind kind = Value::Kind::Tensor);
  // A new input with `from`'s name (made unique), kind and metas: `from` may be another graph's.
  Value* add_input_like(const Value& from);
  Value* find_value(const std::string& name) const;

  const std::vector<Value*>& inputs() const { return inputs_; }
  // What the graph returns: the output node's arguments.
  const std::vector<Arg>& outputs() const { return output_->args(); }
  Node* output_node() const { return output_.get(); }
  void add_output(Arg arg);
  void set_output(size_t index, Arg arg) { set_arg(output_.get(), index, std::move(arg)); }

  std::vector<Node*> nodes() const;
  size_t size() const { return nodes_.size(); }
  // How many values the graph has made (Value::id is below it), for arrays indexed by value.
  size_t num_values() const { return values_.size(); }

  // A node calling dispatcher op `qualified` ("aten::add.Tensor", "_c10d_functional::wait_tensor";
  // overload "" by default), with `args` for the leading schema arguments and the schema's defaults
  // for the rest, inserted before `before` (nullptr: at the end). Its outputs are new values named
  // after `name`, without metas: the caller sets them. Throws DTensorError for an unknown op.
  Node* insert(Node* before, const std::string& qualified, std::vector<Arg> args, const std::string& name);
  Node* insert_after(Node* after, const std::string& qualified, std::vector<Arg> args, const std::string& name);
  // A node computing Python's integer operator `op` ("mul", "floordiv", ...) on sizes (SymInt or
  // constant arguments), inserted before `before`; its output is a new SymInt value.
  Node* insert_integer_operator(Node* before, const std::string& op, std::vector<Arg> args, const std::string& name);
  // Takes a node built with its outputs, and its arguments (the reader's way).
  Node* append(std::unique_ptr<Node> node, std::vector<Arg> args);

  // Every use of `from` (in node arguments and graph outputs) becomes `to`, except in `except`.
  void replace_all_uses(Value* from, Value* to, const Node* except = nullptr);
  // Argument `index` of `node` (or of the output node) becomes `arg`: the way to rewire a node, with
  // use-lists following.
  void set_arg(Node* node, size_t index, Arg arg);
  // The nodes reading `v`, each once, in the order they came to read it (the output node among them).
  std::vector<Node*> users(const Value* v) const;
  // "" when the graph is well formed, otherwise its first problem: every value a node reads (the
  // output node too) is a graph input or an output of an earlier node, and every use-list matches what
  // the nodes read. Pass pipelines run it after every pass, as MLIR verifies after each.
  std::string verify() const;
  // Removes a node whose outputs nothing uses any more, the graph's outputs included (throws
  // DTensorError otherwise).
  void erase(Node* node);
  // Copies `sub`'s nodes before `before`, its inputs bound to `inputs`; returns what its outputs
  // became (values of this graph).
  std::vector<Value*> insert_subgraph(Node* before, const Graph& sub, const std::vector<Value*>& inputs);
  // Appends a copy of `node`, another graph's, its reads mapped through `mapped` (which must hold
  // them all); its outputs are new values with the same metas, added to `mapped`.
  Node* append_copy(const Node& node, std::map<const Value*, Value*>& mapped);

  // One line per node: "%y = aten::mm(%x, %w)  [4, 8] S(0)  # blocks.0.mlp.fc1; note", the
  // placements and notes from `annotations` where given.
  std::string str(const Annotations* annotations = nullptr) const;

 private:
  std::string unique_name(const std::string& name);
  // A copy of another graph's `node` (not placed yet), as append_copy describes.
  std::unique_ptr<Node> copy_of(const Node& node, std::map<const Value*, Value*>& mapped);
  // A new value with `from`'s name (made unique), kind and metas, read by nothing yet.
  Value* new_value_like(const Value& from);
  std::list<std::unique_ptr<Node>>::iterator position(const Node* node);
  // Puts `node` into the list before `at`, its reads into its inputs' use-lists.
  Node* place(std::list<std::unique_ptr<Node>>::iterator at, std::unique_ptr<Node> node);
  static void link(Node* node);
  static void unlink(Node* node);

  std::list<std::unique_ptr<Node>> nodes_;
  std::unordered_map<const Node*, std::list<std::unique_ptr<Node>>::iterator> where_;  // each node's place
  std::vector<std::unique_ptr<Value>> values_;
  std::map<std::string, Value*> by_name_;
  std::set<std::string> node_names_;  // the nodes' names (place() records them)
  std::vector<Value*> inputs_;
  std::unique_ptr<Node> output_;
  uint64_t next_node_id_ = 0;
};

// Inserts nodes at one place of a graph, each taking the provenance of the node it is written for:
// torch.fx's `with graph.inserting_before(n)` together with the copy of n.meta that FX passes make by
// hand. What a pass writes for a node (a reshard before it, the ops of its graph form, its fused
// replacement) then stays in that node's module in the saved program, where torch.export's unflatten
// and a split at module boundaries look for it.
class InsertionScope {
 public:
  // Before `before` (nullptr: at the end), with `origin`'s provenance (nullptr: none).
  InsertionScope(Graph& graph, Node* before, const Node* origin) : graph_(graph), before_(before), origin_(origin) {}
  // Before `before`, with its provenance.
  InsertionScope(Graph& graph, Node* before) : InsertionScope(graph, before, before) {}

  Node* insert(const std::string& qualified, std::vector<Arg> args, const std::string& name) const;
  Node* insert_integer_operator(const std::string& op, std::vector<Arg> args, const std::string& name) const;

 private:
  Node* with_provenance(Node* node) const;

  Graph& graph_;
  Node* before_;
  const Node* origin_;
};

}  // namespace dtensor::graph
