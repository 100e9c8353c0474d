// Runs a program node by node through the ATen dispatcher (boxed calls), freeing each value right
// after its last use, and applying buffer mutations to the program's state.

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "dtensor/errors.h"
#include "dtensor/graph/program.h"
#include "integer_ops.h"

namespace dtensor::graph {
namespace {

// Errors name the program's file, when it came from one.
std::string run_of(const Program& program) { return "graph run" + (program.source.empty() ? "" : " of " + program.source); }

// The values of a run, in arrays indexed by Value::id (dense): a run binds, reads and frees each value
// of a deep training graph, and hashing them cost more than some of the small ops themselves.
class Environment {
 public:
  Environment(size_t values, RunStats* stats, std::string where)
      : values_(values), bound_(values, 0), counted_(values, 0), stats_(stats), where_(std::move(where)) {}

  void bind(const Value* v, c10::IValue value, bool counted) {
    if (counted && value.isTensor()) add(value.toTensor().defined() ? value.toTensor().nbytes() : 0);
    counted_[v->id] = counted;
    bound_[v->id] = 1;
    values_[v->id] = std::move(value);
  }
  const c10::IValue& at(const Value* v) const {
    if (!bound_[v->id]) throw DTensorError(where_ + ": value %" + v->name + " has no value (freed, or never computed by its node)");
    return values_[v->id];
  }
  void free(const Value* v) {
    if (!bound_[v->id]) return;
    const c10::IValue& value = values_[v->id];
    if (counted_[v->id] && value.isTensor() && value.toTensor().defined()) live_ -= static_cast<int64_t>(value.toTensor().nbytes());
    values_[v->id] = c10::IValue();
    bound_[v->id] = 0;
  }

 private:
  void add(size_t bytes) {
    live_ += static_cast<int64_t>(bytes);
    if (stats_) stats_->peak_live_bytes = std::max(stats_->peak_live_bytes, live_);
  }
  std::vector<c10::IValue> values_;
  std::vector<char> bound_, counted_;
  int64_t live_ = 0;
  RunStats* stats_;
  std::string where_;  // for errors: the run and its program's file
};

int64_t size_of(const SymSize& s, const Environment& env) { return s.symbol ? env.at(s.symbol).toInt() : s.value; }

c10::IValue value_of(const Arg& a, const Environment& env) {
  switch (a.kind) {
    case Arg::Kind::Constant: return a.constant;
    case Arg::Kind::Number: return wrapped_number(a.constant.toScalar());
    case Arg::Kind::Tensor: return env.at(a.values[0]);
    case Arg::Kind::Tensors: {
      c10::List<at::Tensor> list;
      for (const Value* v : a.values) list.push_back(env.at(v).toTensor());
      return list;
    }
    case Arg::Kind::OptionalTensors: {
      c10::List<std::optional<at::Tensor>> list;
      for (const Value* v : a.values) list.push_back(v ? std::optional<at::Tensor>(env.at(v).toTensor()) : std::nullopt);
      return list;
    }
    case Arg::Kind::SymInt: {
      const int64_t size = size_of(a.sizes[0], env);
      return a.tensor_number ? c10::IValue(wrapped_number(size)) : c10::IValue(size);
    }
    case Arg::Kind::SymInts: {
      std::vector<int64_t> sizes;
      for (const SymSize& s : a.sizes) sizes.push_back(size_of(s, env));
      return sizes;
    }
  }
  return {};
}

int64_t integer_operator(const Program& program, const Node& node, const Environment& env) {
  std::vector<int64_t> v;
  for (const Arg& a : node.args()) v.push_back(a.kind == Arg::Kind::SymInt ? size_of(a.sizes[0], env) : a.constant.toInt());
  return detail::apply_integer_operator(node.target, v, run_of(program) + ": node '" + node.name + "'");
}

// Binds what an op returned to the node's outputs, each of the kind the file declares.
void bind_results(const Program& program, const Node& node, torch::jit::Stack& results, Environment& env) {
  size_t k = 0;
  auto bind = [&](c10::IValue r) {
    if (k >= node.outputs.size()) return;
    Value* out = node.outputs[k++];
    if (out->is_tensor() ? !(r.isTensor() || r.isNone()) : !r.isInt())
      throw DTensorError(run_of(program) + ": node '" + node.name + "' (" + node.op_name() + ") returned a " + r.tagKind() + " for %" +
                         out->name + ", which the file declares a " + (out->is_tensor() ? "tensor" : "symbolic integer"));
    env.bind(out, std::move(r), true);
  };
  for (c10::IValue& r : results) {
    if (!r.isTensorList()) bind(std::move(r));
    else
      for (const at::Tensor& t : r.toTensorList()) bind(t);
  }
}

// The functional all-reduce (out of place: it clones its input) and its in-place form, which
// hand-written tensor parallelism uses.
struct AllReduceOps {
  c10::OperatorHandle functional, in_place;
};
const AllReduceOps& all_reduce_ops() {
  static const AllReduceOps ops{c10::Dispatcher::singleton().findSchemaOrThrow("_c10d_functional::all_reduce", ""),
                                c10::Dispatcher::singleton().findSchemaOrThrow("_c10d_functional::all_reduce_", "")};
  return ops;
}

// Runs one dispatcher op node on its arguments' values; every failure names the file and the node.
// `input_dies_here`: this node is the last to read its first argument, so an all-reduce may take
// that tensor over and reduce it in place when nothing else holds it or its storage (the saved
// program stays functional; only this run skips the clone). `stack` is the run's one stack, empty
// between nodes and reused by every node so that a node allocates none.
void call(const Program& program, const Node& node, Environment& env, bool input_dies_here, torch::jit::Stack& stack) {
  try {
    for (const Arg& a : node.args()) stack.push_back(value_of(a, env));
    const c10::OperatorHandle* op = &*node.op;
    if (input_dies_here && *op == all_reduce_ops().functional && stack[0].isTensor()) {
      env.free(node.args()[0].values[0]);
      const at::Tensor& input = stack[0].toTensor();
      if (input.use_count() == 1 && input.storage().use_count() == 1 && input.is_contiguous()) op = &all_reduce_ops().in_place;
    }
    if (const LocalKernel* kernel = program.annotations.local_kernel(node)) (*kernel)(*op, stack);
    else op->callBoxed(stack);
    bind_results(program, node, stack, env);
    stack.clear();  // holds nothing past its node (an all-reduce may take its input over)
  } catch (const DTensorError&) {
    throw;
  } catch (const c10::Error& e) {
    throw DTensorError(run_of(program) + ": node '" + node.name + "' (" + node.op_name() + ") failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw DTensorError(run_of(program) + ": node '" + node.name + "' (" + node.op_name() + ") failed: " + what.substr(0, what.find('\n')));
  }
}

constexpr size_t kReadByOutputs = SIZE_MAX, kNeverRead = SIZE_MAX - 1;

// Calls f(value) for every value `node` reads (tensors and symbolic sizes), without collecting them.
template <typename F>
void for_each_read(const Node& node, F&& f) {
  for (const Arg& a : node.args()) {
    for (const Value* v : a.values)
      if (v) f(v);
    for (const SymSize& s : a.sizes)
      if (s.symbol) f(s.symbol);
  }
}

// The last node (position) that reads each value, by Value::id: kReadByOutputs for graph outputs
// (never freed), kNeverRead for values nothing reads.
std::vector<size_t> last_reads(const Graph& graph, const std::vector<Node*>& nodes) {
  std::vector<size_t> last(graph.num_values(), kNeverRead);
  for (size_t i = 0; i < nodes.size(); ++i) for_each_read(*nodes[i], [&](const Value* v) { last[v->id] = i; });
  for (const Arg& a : graph.outputs()) {
    for (const Value* v : a.values)
      if (v) last[v->id] = kReadByOutputs;
    for (const SymSize& s : a.sizes)
      if (s.symbol) last[s.symbol->id] = kReadByOutputs;
  }
  return last;
}

// Binds the program's inputs: user inputs in order (checked against what each takes), state tensors.
void bind_inputs(Program& program, const std::vector<c10::IValue>& user_inputs, Environment& env) {
  size_t next_user = 0;
  for (const InputSpec& spec : program.inputs) {
    if (spec.kind != InputSpec::Kind::UserInput) {
      env.bind(spec.value, program.state.at(spec.target).tensor(), false);
      continue;
    }
    if (next_user >= user_inputs.size())
      throw DTensorError(run_of(program) + ": the program takes " + std::to_string(program.user_inputs().size()) + " user inputs, got " +
                         std::to_string(user_inputs.size()));
    const c10::IValue& input = user_inputs[next_user];
    if (spec.value->is_tensor() ? !input.isTensor() : !input.isInt())
      throw DTensorError(run_of(program) + ": user input " + std::to_string(next_user) + " (%" + spec.value->name + ") takes " +
                         (spec.value->is_tensor() ? "a tensor" : "an integer") + ", got a " + input.tagKind());
    env.bind(spec.value, input, true);
    ++next_user;
  }
  if (next_user != user_inputs.size())
    throw DTensorError(run_of(program) + ": the program takes " + std::to_string(next_user) + " user inputs, got " +
                       std::to_string(user_inputs.size()));
}

// Runs every node in order, freeing values after their last read where the options ask.
void run_nodes(Program& program, const RunOptions& options, Environment& env) {
  const auto nodes = program.graph.nodes();
  const std::vector<size_t> last = last_reads(program.graph, nodes);
  // With grad mode off the autograd kernels record nothing and only redispatch, so the nodes skip
  // them (hand-written eager code cannot). View and version-counter tracking (ADInplaceOrView) still
  // runs, so the outputs behave as eager ones do; the buffer updates run with the caller's dispatch.
  torch::jit::Stack stack;
  std::optional<at::AutoDispatchBelowAutograd> below_autograd;
  if (!at::GradMode::is_enabled()) below_autograd.emplace();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& node = *nodes[i];
    if (!node.op) {
      env.bind(node.outputs.at(0), integer_operator(program, node, env), true);
    } else {
      const Value* first = !node.args().empty() && node.args()[0].kind == Arg::Kind::Tensor ? node.args()[0].values[0] : nullptr;
      call(program, node, env, options.free_after_last_use && first && last[first->id] == i, stack);
    }
    if (!options.free_after_last_use) continue;
    for_each_read(node, [&](const Value* v) {
      if (last[v->id] == i) env.free(v);
    });
    for (const Value* v : node.outputs)
      if (last[v->id] == kNeverRead) env.free(v);
  }
}

// The user outputs; buffer mutations are written into their buffers, as torch.export's runtime does.
std::vector<c10::IValue> take_outputs(Program& program, const Environment& env) {
  std::vector<c10::IValue> out;
  const auto& outputs = program.graph.outputs();
  for (size_t k = 0; k < outputs.size(); ++k) {
    const c10::IValue value = value_of(outputs[k], env);
    if (program.outputs[k].kind != OutputSpec::Kind::BufferMutation) {
      out.push_back(value);
      continue;
    }
    at::Tensor buffer = program.state.at(program.outputs[k].target).tensor();
    try {
      buffer.copy_(value.toTensor());
    } catch (const c10::Error& e) {
      throw DTensorError(run_of(program) + ": the new value of buffer '" + program.outputs[k].target + "' does not fit it: " +
                         e.what_without_backtrace());
    }
  }
  return out;
}

}  // namespace

std::vector<c10::IValue> run(Program& program, const std::vector<c10::IValue>& user_inputs, const RunOptions& options,
                             RunStats* stats) {
  Environment env(program.graph.num_values(), stats, run_of(program));
  bind_inputs(program, user_inputs, env);
  run_nodes(program, options, env);
  return take_outputs(program, env);
}

std::vector<Value*> Program::user_inputs() const {
  std::vector<Value*> out;
  for (const InputSpec& s : inputs)
    if (s.kind == InputSpec::Kind::UserInput) out.push_back(s.value);
  return out;
}

}  // namespace dtensor::graph
