#include "experts_fusion.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "dead_code.h"
#include "dtensor/errors.h"
#include "strategy_choice.h"

namespace dtensor::graph::detail {
namespace {

// One experts computation found in a program (experts_fusion.h).
struct ExpertsSite {
  Value *hidden = nullptr, *experts = nullptr, *weights = nullptr, *gate_up = nullptr, *down = nullptr;
  Value* out = nullptr;
  Value* grad = nullptr;  // joint programs: the gradient of `out` the backward starts from
  std::vector<Node*> forward, backward, constants;  // each in graph order
  std::string name;  // its weights, for errors
  std::vector<Value*> inputs() const { return {hidden, experts, weights, gate_up, down}; }
};

// The gradients the backward op returns, in its order.
enum Role { kHidden, kWeights, kGateUp, kDown, kRoles };

std::string fusion_error(const ExpertsSite& site, const std::string& what) {
  return "expert parallelism of the experts with weights " + site.name + ": " + what +
         "; only transformers' \"batched_mm\" experts (each token-expert pair selects its expert's weights by index, then one "
         "batched multiply) can be spread, so leave these weights out of Shard(0) placements";
}

bool passes_on(const Node& n) {
  // repeat_interleave(x, k, 0): the training IR's copy of each token's row for its k experts.
  static const std::set<std::string> more = {"aten::squeeze.dims", "aten::squeeze", "aten::contiguous", "aten::flatten.using_ints",
                                             "aten::repeat_interleave.self_int"};
  return is_view_like(n) || (n.op && more.count(n.op_name()) > 0);
}

Value* first_tensor_arg(const Node& n) {
  return !n.args().empty() && n.args()[0].kind == Arg::Kind::Tensor ? n.args()[0].values[0] : nullptr;
}

// From `v` back through ops that only pass their input on, to the first value `wanted` accepts.
Value* back_to(Value* v, const std::function<bool(const Value&)>& wanted) {
  for (int hops = 0; v && hops < 10; ++hops) {
    if (wanted(*v)) return v;
    Node* p = v->producer();
    v = p && passes_on(*p) ? first_tensor_arg(*p) : nullptr;
  }
  return nullptr;
}

bool shard0_somewhere(const Program& program, const Value& v) {
  const Placements* p = program.annotations.placements(v);
  return p && std::any_of(p->begin(), p->end(), [](const Placement& x) { return x == Placement(Shard(0)); });
}

// Positions of the graph's nodes, for "first in graph order" among a value's readers.
using Order = std::map<const Node*, size_t>;

Node* first_reader(const Value* v, const Order& order) {
  Node* first = nullptr;
  for (Node* n : v->uses())
    if (!n->is_output() && (!first || order.at(n) < order.at(first))) first = n;
  return first;
}

Node* first_reader_with_op(const Value* v, const Order& order, const std::string& op) {
  Node* first = nullptr;
  for (Node* n : v->uses())
    if (!n->is_output() && n->op_name() == op && (!first || order.at(n) < order.at(first))) first = n;
  return first;
}

// index.Tensor(weight, [ids]) nodes of the program's 3-d parameters, by the index they select with.
std::map<Value*, std::vector<Node*>> experts_selections(const Program& program) {
  std::map<Value*, std::vector<Node*>> out;
  for (const InputSpec& spec : program.inputs) {
    if (spec.kind != InputSpec::Kind::Parameter || spec.value->meta.shape.size() != 3) continue;
    for (Node* n : spec.value->uses()) {
      const auto& args = n->args();
      if (n->op_name() == "aten::index.Tensor" && args.size() == 2 && first_tensor_arg(*n) == spec.value &&
          args[1].kind == Arg::Kind::OptionalTensors && args[1].values.size() == 1 && args[1].values[0])
        out[args[1].values[0]].push_back(n);
    }
  }
  return out;
}

// The forward's ends: the hidden states and the routing weights it reads, the weighted sum it returns.
void find_forward_ends(ExpertsSite& site, Node* gate_up_selected, Node* down_selected, const Order& order) {
  const Shape& routing = site.experts->meta.shape;
  const Shape tokens{routing[0], site.gate_up->meta.shape[2]};
  const auto shaped = [](const Shape& s) { return [s](const Value& v) { return v.meta.shape == s; }; };
  Node* up = first_reader_with_op(gate_up_selected->outputs[0], order, "aten::bmm");
  Node* down = first_reader_with_op(down_selected->outputs[0], order, "aten::bmm");
  if (!up || !down || up->args().size() < 2 || down->outputs.empty()) throw DTensorError(fusion_error(site, "no batched multiply reads the selected weights"));
  site.hidden = back_to(up->args()[1].values[0], shaped(tokens));
  Value* v = down->outputs[0];
  for (int hops = 0; v && hops < 10 && !site.weights; ++hops) {
    Node* next = first_reader(v, order);
    if (next && next->op_name() == "aten::mul.Tensor" && next->args().size() == 2 && next->args()[1].kind == Arg::Kind::Tensor) {
      Value* other = next->args()[0].values[0] == v ? next->args()[1].values[0] : next->args()[0].values[0];
      site.weights = back_to(other, shaped(routing));
    }
    v = next && (passes_on(*next) || site.weights) ? next->outputs[0] : nullptr;
  }
  // The weighted rows summed per token: the last [T, H] value of the views and sums that follow.
  for (int hops = 0; v && hops < 10; ++hops) {
    if (v->meta.shape == tokens) site.out = v;
    Node* next = first_reader(v, order);
    const bool sums = next && next->op_name() == "aten::sum.dim_IntList";
    v = next && (passes_on(*next) || sums) && !next->outputs.empty() ? next->outputs[0] : nullptr;
  }
  if (!site.hidden) throw DTensorError(fusion_error(site, "the hidden states its first batched multiply reads were not found"));
  if (!site.weights) throw DTensorError(fusion_error(site, "the routing weights its outputs are scaled by were not found"));
  if (!site.out) throw DTensorError(fusion_error(site, "the weighted sum per token it ends in was not found"));
}

// The forward's nodes: everything `out` is computed from, back to the site's inputs, in graph order.
void collect_forward(ExpertsSite& site, const Order& order) {
  const std::vector<Value*> ends = site.inputs();
  std::set<Node*> seen;
  std::vector<Value*> todo = {site.out};
  while (!todo.empty()) {
    Value* v = todo.back();
    todo.pop_back();
    if (std::find(ends.begin(), ends.end(), v) != ends.end()) continue;
    Node* p = v->producer();
    if (!p) throw DTensorError(fusion_error(site, "its weighted sum reads %" + v->name + ", which is none of its inputs"));
    if (!seen.insert(p).second) continue;
    for (Value* in : p->inputs()) todo.push_back(in);
  }
  site.forward.assign(seen.begin(), seen.end());
  std::sort(site.forward.begin(), site.forward.end(), [&](const Node* a, const Node* b) { return order.at(a) < order.at(b); });
}

// Whether `v` is computed from no input of the program (zeros a gradient starts from, a constant).
bool is_constant(const Value* v, std::map<const Value*, bool>& memo) {
  if (auto it = memo.find(v); it != memo.end()) return it->second;
  const Node* p = v->producer();
  bool constant = p != nullptr && p->op.has_value();
  memo[v] = false;  // a cycle cannot occur, but a half-answered value must not count as constant
  if (constant)
    for (const Value* in : p->inputs()) constant = constant && is_constant(in, memo);
  return memo[v] = constant;
}

// The constants `v` is computed from (with itself), for the site's own run.
void add_constant_nodes(const Value* v, std::set<Node*>& into) {
  Node* p = v->producer();
  if (!p || !into.insert(p).second) return;
  for (const Value* in : p->inputs()) add_constant_nodes(in, into);
}

// The backward, in a joint program: every node that reads what the forward computed, or what such a
// node computed, as long as it reads nothing else but the site's inputs, constants and the gradient of
// the weighted sum (`site.grad`, found through the views that spread it over each token's k rows).
void collect_backward(ExpertsSite& site, Graph& graph, const Order& order) {
  std::set<const Value*> computed;
  for (const Node* n : site.forward)
    for (const Value* v : n->outputs)
      if (v != site.out) computed.insert(v);
  const std::vector<Value*> ends = site.inputs();
  std::map<const Value*, bool> constants;
  std::set<Node*> constant_nodes, taken;
  const std::set<Node*> forward(site.forward.begin(), site.forward.end());
  const Shape& grad_shape = site.out->meta.shape;
  for (Node* n : graph.nodes()) {
    if (forward.count(n)) continue;
    const auto inputs = n->inputs();
    if (std::none_of(inputs.begin(), inputs.end(), [&](const Value* v) { return computed.count(v) > 0; })) continue;
    std::vector<Node*> chain;
    Value* candidate = nullptr;  // the gradient this node reads, taken only if the node fits
    bool fits = true;
    for (Value* in : inputs) {
      if (computed.count(in) || in == site.grad || std::find(ends.begin(), ends.end(), in) != ends.end()) continue;
      if (is_constant(in, constants)) {
        add_constant_nodes(in, constant_nodes);
        continue;
      }
      Value* grad = back_to(in, [&](const Value& v) { return v.meta.shape == grad_shape; });
      fits = fits && grad && (!site.grad || grad == site.grad) && (!candidate || grad == candidate);
      if (!fits) break;
      candidate = grad;
      for (Value* v = in; v != grad; v = first_tensor_arg(*v->producer())) chain.push_back(v->producer());
    }
    if (!fits) continue;
    if (candidate) site.grad = candidate;
    for (Node* c : chain)
      if (taken.insert(c).second)
        for (const Value* v : c->outputs) computed.insert(v);
    taken.insert(n);
    for (const Value* v : n->outputs) computed.insert(v);
  }
  const auto by_order = [&](const Node* a, const Node* b) { return order.at(a) < order.at(b); };
  site.backward.assign(taken.begin(), taken.end());
  std::sort(site.backward.begin(), site.backward.end(), by_order);
  site.constants.assign(constant_nodes.begin(), constant_nodes.end());
  std::sort(site.constants.begin(), site.constants.end(), by_order);
}

std::vector<ExpertsSite> find_sites(Program& program, std::map<Value*, std::vector<Node*>> selections, const Order& order) {
  std::vector<ExpertsSite> sites;
  for (auto& [index, selected] : selections) {
    if (selected.size() != 2) continue;
    Value* a = first_tensor_arg(*selected[0]);
    Value* b = first_tensor_arg(*selected[1]);
    const bool a_first = a->meta.shape[1] == 2 * b->meta.shape[2] && a->meta.shape[2] == b->meta.shape[1];
    if (!a_first) {
      std::swap(a, b);
      std::swap(selected[0], selected[1]);
    }
    ExpertsSite site;
    site.gate_up = a;
    site.down = b;
    site.name = a->name + " and " + b->name;
    const bool spread_a = shard0_somewhere(program, *a), spread_b = shard0_somewhere(program, *b);
    if (!spread_a && !spread_b) continue;
    if (spread_a != spread_b || a->meta.shape[0] != b->meta.shape[0])
      throw DTensorError(fusion_error(site, "both weights must hold the same experts, spread alike"));
    site.experts = back_to(index, [](const Value& v) { return v.meta.shape.size() == 2 && at::isIntegralType(v.meta.dtype, false); });
    if (!site.experts) throw DTensorError(fusion_error(site, "its chosen experts [tokens, k] were not found"));
    find_forward_ends(site, selected[0], selected[1], order);
    collect_forward(site, order);
    sites.push_back(std::move(site));
  }
  return sites;
}


std::vector<c10::IValue> call_op(const char* name, std::vector<c10::IValue> args) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  op.callBoxed(args);
  return args;
}

// The site on its own: inputs hidden, experts, weights, gate_up, down (and the gradient), outputs the
// weighted sum and then every tensor the backward computes.
Program site_program(const ExpertsSite& site, const Order& order) {
  Program p;
  p.source = "the experts with weights " + site.name;
  std::map<const Value*, Value*> mapped;
  std::vector<Value*> inputs = site.inputs();
  if (site.grad) inputs.push_back(site.grad);
  for (Value* v : inputs) {
    mapped[v] = p.graph.add_input_like(*v);
    p.inputs.push_back({InputSpec::Kind::UserInput, mapped[v], ""});
  }
  std::vector<Node*> nodes = site.constants;
  nodes.insert(nodes.end(), site.forward.begin(), site.forward.end());
  nodes.insert(nodes.end(), site.backward.begin(), site.backward.end());
  std::sort(nodes.begin(), nodes.end(), [&](const Node* a, const Node* b) { return order.at(a) < order.at(b); });
  for (const Node* n : nodes) p.graph.append_copy(*n, mapped);
  auto add_output = [&](const Value* v) {
    p.graph.add_output(Arg::tensor(mapped.at(v)));
    p.outputs.push_back({OutputSpec::Kind::UserOutput, ""});
  };
  add_output(site.out);
  for (const Node* n : site.backward)
    for (const Value* v : n->outputs)
      if (v->is_tensor()) add_output(v);
  return p;
}

// Within `relative` of the largest magnitude (the dtype's rounding, summed in two orders).
bool close(const at::Tensor& got, const at::Tensor& expected, double relative) {
  if (!got.sizes().equals(expected.sizes())) return false;
  const double scale = expected.numel() ? expected.abs().max().item<double>() : 0.0;
  return at::allclose(got.to(at::kDouble), expected.to(at::kDouble), relative, relative * std::max(scale, 1e-6));
}

// Runs the site on random inputs against the experts ops. Returns, per Role, the backward's value
// that is that gradient (none in a forward program, or where nothing computes it).
std::array<Value*, kRoles> checked_gradients(const ExpertsSite& site, const Order& order) {
  Program p = site_program(site, order);
  at::Generator random = at::make_generator<at::CPUGeneratorImpl>(20261204);
  // In the program's dtypes (its constants have them); the op and the program round differently.
  const auto like = [](const Value* v) { return at::TensorOptions().dtype(v->meta.dtype); };
  const double relative = c10::elementSize(site.hidden->meta.dtype) < 4 ? 5e-2 : 1e-3;
  std::vector<at::Tensor> in = {at::randn(site.hidden->meta.shape, random, like(site.hidden)),
                                at::randint(0, site.gate_up->meta.shape[0], site.experts->meta.shape, random, like(site.experts)),
                                at::rand(site.weights->meta.shape, random, like(site.weights)),
                                at::randn(site.gate_up->meta.shape, random, like(site.gate_up)) * 0.2,
                                at::randn(site.down->meta.shape, random, like(site.down)) * 0.2};
  if (site.grad) in.push_back(at::randn(site.grad->meta.shape, random, like(site.grad)));
  std::vector<c10::IValue> got;
  try {
    got = run(p, std::vector<c10::IValue>(in.begin(), in.end()));
  } catch (const DTensorError& e) {
    throw DTensorError(fusion_error(site, std::string("it does not run on its own (") + e.what() + ")"));
  }
  const std::vector<c10::IValue> operands(in.begin(), in.begin() + 5);
  if (!close(got[0].toTensor(), call_op("dtensor::moe_experts", operands)[0].toTensor(), relative))
    throw DTensorError(fusion_error(site, "it does not compute the routing-weighted sum of its experts' SwiGLU MLPs"));
  std::array<Value*, kRoles> found{};
  if (!site.grad) return found;
  std::vector<c10::IValue> with_grad = {in[5]};
  with_grad.insert(with_grad.end(), operands.begin(), operands.end());
  const std::vector<c10::IValue> expected = call_op("dtensor::moe_experts_backward", with_grad);
  size_t k = 1;
  for (const Node* n : site.backward)
    for (Value* v : n->outputs) {
      if (!v->is_tensor()) continue;
      const at::Tensor t = got[k++].toTensor();
      for (int r = 0; r < kRoles; ++r)
        if (!found[r] && close(t, expected[r].toTensor(), relative)) found[r] = v;
    }
  if (!found[kHidden] || !found[kGateUp] || !found[kDown])
    throw DTensorError(fusion_error(site, "its backward does not compute the gradients of its hidden states and weights"));
  return found;
}

// The site becomes the experts ops; what it computed before is erased where nothing else reads it.
void rewrite(Graph& graph, const ExpertsSite& site, const std::array<Value*, kRoles>& gradients) {
  const std::vector<Value*> inputs = site.inputs();
  std::vector<Arg> args;
  for (Value* v : inputs) args.push_back(Arg::tensor(v));
  Node* forward = InsertionScope(graph, site.out->producer()).insert("dtensor::moe_experts", args, "moe_experts");
  forward->outputs[0]->meta = site.out->meta;
  graph.replace_all_uses(site.out, forward->outputs[0]);
  if (site.grad) {
    args.insert(args.begin(), Arg::tensor(site.grad));
    Node* after = site.grad->producer();
    Node* before = site.backward.front();
    Node* backward = after ? graph.insert_after(after, "dtensor::moe_experts_backward", args, "moe_experts_backward")
                           : graph.insert(before, "dtensor::moe_experts_backward", args, "moe_experts_backward");
    copy_provenance(*before, *backward);
    const std::array<Value*, kRoles> of = {site.hidden, site.weights, site.gate_up, site.down};
    for (int r = 0; r < kRoles; ++r) {
      backward->outputs[r]->meta = (gradients[r] ? gradients[r] : of[r])->meta;
      if (!gradients[r]) continue;
      graph.replace_all_uses(gradients[r], backward->outputs[r]);
      erase_if_unused(graph, gradients[r]);
    }
  }
  erase_if_unused(graph, site.out);
}

Order positions(const Graph& graph) {
  Order order;
  for (const Node* n : graph.nodes()) order.emplace(n, order.size());
  return order;
}

}  // namespace

void fuse_spread_experts(Program& program) {
  // One site at a time, found again after each rewrite (a rewritten site selects no experts by index any
  // more): a site's inputs may be what an earlier one computed.
  for (;;) {
    auto selections = experts_selections(program);
    if (selections.empty()) return;  // most programs: no positions to number
    const Order order = positions(program.graph);
    std::vector<ExpertsSite> sites = find_sites(program, std::move(selections), order);
    if (sites.empty()) return;
    ExpertsSite& site = *std::min_element(sites.begin(), sites.end(), [&](const ExpertsSite& a, const ExpertsSite& b) {
      return order.at(a.out->producer()) < order.at(b.out->producer());
    });
    collect_backward(site, program.graph, order);
    rewrite(program.graph, site, checked_gradients(site, order));
    for (const Value* weight : {site.gate_up, site.down})
      for (const Node* n : weight->uses())
        if (n->op_name() == "aten::index.Tensor")
          throw DTensorError(fusion_error(site, "node '" + n->name + "' still selects its experts after the rewrite (a part of the "
                                                "backward that was not recognised reads the forward), so every rank would gather them"));
  }
}

}  // namespace dtensor::graph::detail
