#pragma once
// dtensor's graph IR: what an exported program (torch.export's .pt2) is once read, and what the graph
// transforms edit. Values are tensors or symbolic integers; nodes call an op (through the ATen
// dispatcher) or an integer operator on symbolic sizes, with one argument per schema argument.
//
// The editing API is what seed 000's passes do on FX graphs: insert a node before or after another,
// replace all uses of a value, erase a node, insert a whole subgraph. Values and nodes have stable
// addresses for the graph's lifetime.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <list>
#include <map>
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

  Node* producer = nullptr;               // nullptr for a graph input
  // The nodes that read it, once per read (an argument or a size), kept current by every edit the
  // Graph makes: users() without a scan of the graph. Graph outputs are not uses.
  std::vector<Node*> uses;

  bool is_tensor() const { return kind == Kind::Tensor; }
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
  std::vector<Arg> args;  // one per schema argument (integer operators: a, b)
  std::vector<Value*> outputs;
  std::map<std::string, std::string> metadata;  // stack_trace, nn_module_stack, ... as read
  std::string module_path;  // the innermost module that ran it ("blocks.0.attn.wq"), "" at the root
  std::string module_type;  // its class ("torch.nn.modules.linear.Linear")

  // "aten::mm" / "aten::add.Tensor" for dispatcher ops, the target otherwise.
  std::string op_name() const;
  std::vector<Value*> inputs() const;  // every value it reads, in argument order
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  // A new value named `name` (made unique by a suffix if taken), owned by the graph.
  Value* new_value(const std::string& name, Value::Kind kind = Value::Kind::Tensor);
  Value* add_input(const std::string& name, Value::Kind kind = Value::Kind::Tensor);
  Value* find_value(const std::string& name) const;

  const std::vector<Value*>& inputs() const { return inputs_; }
  std::vector<Arg>& outputs() { return outputs_; }
  const std::vector<Arg>& outputs() const { return outputs_; }

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
  // Takes a fully built node (the reader's way).
  Node* append(std::unique_ptr<Node> node);

  // Every use of `from` (in node arguments and graph outputs) becomes `to`, except in `except`.
  void replace_all_uses(Value* from, Value* to, const Node* except = nullptr);
  // Argument `index` of `node` becomes `arg` (the way to rewire a node: use-lists follow).
  void set_arg(Node* node, size_t index, Arg arg);
  // The nodes reading `v`, each once, in the order they came to read it.
  std::vector<Node*> users(const Value* v) const;
  // "" when every value's use-list matches what the nodes read; otherwise the first difference.
  std::string check_uses() const;
  // Removes a node whose outputs nothing uses any more (throws DTensorError otherwise).
  void erase(Node* node);
  // Copies `sub`'s nodes before `before`, its inputs bound to `inputs`; returns what its outputs
  // became (values of this graph).
  std::vector<Value*> insert_subgraph(Node* before, const Graph& sub, const std::vector<Value*>& inputs);

  // One line per node: "%y = aten::mm(%x, %w)  [4, 8] S(0)  # blocks.0.mlp.fc1; note", the
  // placements and notes from `annotations` where given.
  std::string str(const Annotations* annotations = nullptr) const;

 private:
  std::string unique_name(const std::string& name);
  std::list<std::unique_ptr<Node>>::iterator position(const Node* node);
  // Puts `node` into the list before `at`, its reads into its inputs' use-lists.
  Node* place(std::list<std::unique_ptr<Node>>::iterator at, std::unique_ptr<Node> node);
  static void link(Node* node);
  static void unlink(Node* node);

  std::list<std::unique_ptr<Node>> nodes_;
  std::unordered_map<const Node*, std::list<std::unique_ptr<Node>>::iterator> where_;  // each node's place
  std::vector<std::unique_ptr<Value>> values_;
  std::map<std::string, Value*> by_name_;
  std::vector<Value*> inputs_;
  std::vector<Arg> outputs_;
  uint64_t next_node_id_ = 0;
};

}  // namespace dtensor::graph
