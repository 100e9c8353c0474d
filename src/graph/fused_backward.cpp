#include "fused_backward.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "dead_code.h"
#include "reshard.h"

namespace dtensor::graph::detail {
namespace {

// The node making `v` when it calls `op` (with its overload: "aten::mul.Tensor"), else nullptr.
Node* made_by(const Value* v, const char* op) {
  Node* n = v ? v->producer() : nullptr;
  return n && n->op && n->op_name() == op ? n : nullptr;
}

Value* tensor_arg(const Node* n, size_t i) {
  return n && i < n->args().size() && n->args()[i].kind == Arg::Kind::Tensor ? n->args()[i].values[0] : nullptr;
}

// Whether argument `i` of `n` is the number `value` (a Python number in the graph).
bool is_number(const Node* n, size_t i, double value) {
  if (!n || i >= n->args().size()) return false;
  const Arg& a = n->args()[i];
  if (a.kind != Arg::Kind::Number && a.kind != Arg::Kind::Constant) return false;
  if (!a.constant.isDouble() && !a.constant.isInt()) return false;
  const double x = a.constant.isDouble() ? a.constant.toDouble() : static_cast<double>(a.constant.toInt());
  return std::abs(x - value) <= 1e-12 * std::max(1.0, std::abs(value));
}

// add.Tensor / sub.Tensor with alpha 1.
Node* made_by_unit(const Value* v, const char* op) {
  Node* n = made_by(v, op);
  return n && (n->args().size() < 3 || is_number(n, 2, 1.0)) ? n : nullptr;
}

// sum.dim_IntList(x, dims, keepdim) without a dtype; its dims wrapped and sorted.
struct Sum {
  Value* of = nullptr;
  std::vector<int64_t> dims;
  bool keepdim = false;
};
std::optional<Sum> sum_of(const Value* v) {
  const Node* n = made_by(v, "aten::sum.dim_IntList");
  if (!n || n->args().size() < 3 || !n->args()[1].constant.isIntList() || !n->args()[2].constant.isBool()) return std::nullopt;
  if (n->args().size() > 3 && !n->args()[3].constant.isNone()) return std::nullopt;
  Sum s{tensor_arg(n, 0), n->args()[1].constant.toIntVector(), n->args()[2].constant.toBool()};
  const auto ndim = static_cast<int64_t>(s.of->meta.shape.size());
  for (int64_t& d : s.dims) d = d < 0 ? d + ndim : d;
  std::sort(s.dims.begin(), s.dims.end());
  return s;
}

std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> out;
  for (int64_t d = from; d < to; ++d) out.push_back(d);
  return out;
}

Node* insert_fused(Graph& graph, Node* before, const Node* from, const std::string& op, std::vector<Arg> args) {
  Node* fused = InsertionScope(graph, before, from).insert(op, std::move(args), from->name + "_fused");
  infer_local_metas(*fused);
  return fused;
}

// Replaces `old` (the value a matched form computed) by `by` and erases what only it read.
void replace(Graph& graph, Value* old, Value* by) {
  graph.replace_all_uses(old, by);
  erase_if_unused(graph, old);
}

// grad * (0.5 * (1 + erf(x * M_SQRT1_2)) + x * (M_2_SQRTPI * M_SQRT1_2 * 0.5 * exp(x * x * -0.5)))
// -> gelu_backward(grad, x)
bool fold_gelu(Graph& graph, Node* root) {
  Value* grad = tensor_arg(root, 0);
  const Node* sum = made_by_unit(tensor_arg(root, 1), "aten::add.Tensor");
  const Node* cdf = made_by(tensor_arg(sum, 0), "aten::mul.Tensor");
  const Node* x_pdf = made_by(tensor_arg(sum, 1), "aten::mul.Tensor");
  if (!grad || !cdf || !x_pdf || !is_number(cdf, 1, 0.5)) return false;
  const Node* one_plus = made_by_unit(tensor_arg(cdf, 0), "aten::add.Tensor");
  if (!is_number(one_plus, 1, 1.0)) return false;
  const Node* erf = made_by(tensor_arg(one_plus, 0), "aten::erf");
  const Node* scaled = made_by(tensor_arg(erf, 0), "aten::mul.Tensor");
  if (!is_number(scaled, 1, M_SQRT1_2)) return false;
  Value* x = tensor_arg(scaled, 0);
  const Node* pdf = made_by(tensor_arg(x_pdf, 1), "aten::mul.Tensor");
  if (tensor_arg(x_pdf, 0) != x || !is_number(pdf, 1, M_2_SQRTPI * M_SQRT1_2 * 0.5)) return false;
  const Node* exp = made_by(tensor_arg(pdf, 0), "aten::exp");
  const Node* half_square = made_by(tensor_arg(exp, 0), "aten::mul.Tensor");
  if (!is_number(half_square, 1, -0.5)) return false;
  const Node* square = made_by(tensor_arg(half_square, 0), "aten::mul.Tensor");
  if (tensor_arg(square, 0) != x || tensor_arg(square, 1) != x) return false;
  // The fused kernel takes no broadcasting.
  if (grad->meta.shape != x->meta.shape || grad->meta.dtype != x->meta.dtype) return false;
  Node* fused = insert_fused(graph, root, root, "aten::gelu_backward", {Arg::tensor(grad), Arg::tensor(x)});
  replace(graph, root->outputs[0], fused->outputs[0]);
  return true;
}

// g * y - y * sum(g * y, [dim], keepdim=True) -> _softmax_backward_data(g, y, dim, y's dtype)
bool fold_softmax(Graph& graph, Node* root) {
  if (root->args().size() > 2 && !is_number(root, 2, 1.0)) return false;  // sub's alpha
  const Node* grad_y = made_by(tensor_arg(root, 0), "aten::mul.Tensor");
  const Node* y_sum = made_by(tensor_arg(root, 1), "aten::mul.Tensor");
  if (!grad_y || !y_sum) return false;
  Value* grad = tensor_arg(grad_y, 0);
  Value* y = tensor_arg(grad_y, 1);
  const auto sum = sum_of(tensor_arg(y_sum, 1));
  if (!grad || !y || tensor_arg(y_sum, 0) != y || !sum || sum->of != grad_y->outputs[0] || sum->dims.size() != 1 || !sum->keepdim) return false;
  if (grad->meta.shape != y->meta.shape || grad->meta.dtype != y->meta.dtype) return false;
  Node* fused = insert_fused(graph, root, root, "aten::_softmax_backward_data",
                             {Arg::tensor(grad), Arg::tensor(y), Arg::of(sum->dims[0]), Arg::of(c10::IValue(y->meta.dtype))});
  replace(graph, root->outputs[0], fused->outputs[0]);
  return true;
}

// d_input = (rstd / N) * (grad_x_hat * N - sum(grad_x_hat, inner) - x_hat * sum(grad_x_hat * x_hat, inner)),
// x_hat = (x - mean) * rstd, grad_x_hat = grad_out * weight (or grad_out); then, when present after it,
// d_weight = sum(grad_out * x_hat, outer) and d_bias = sum(grad_out, outer)
// -> native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, mask)
// What a decomposed layer norm backward reads, matched back from the root of its d_input.
struct LayerNormBackward {
  Value *grad_out, *x, *x_hat, *mean, *rstd, *weight, *bias;
  std::vector<int64_t> normalized_shape;
};

// grad_x_hat = grad_out * weight: grad_out, or nullptr where the pattern differs.
Value* unweighted(Value* grad_x_hat, Value* weight) {
  if (!weight) return grad_x_hat;
  const Node* weighted = made_by(grad_x_hat, "aten::mul.Tensor");
  return weighted && tensor_arg(weighted, 1) == weight ? tensor_arg(weighted, 0) : nullptr;
}

std::optional<LayerNormBackward> match_layer_norm_backward(const Node* root) {
  const Node* scale = made_by(tensor_arg(root, 0), "aten::div.Tensor");
  const Node* inner = made_by_unit(tensor_arg(root, 1), "aten::sub.Tensor");
  if (!scale || !inner) return std::nullopt;
  Value* rstd = tensor_arg(scale, 0);
  const Node* a_minus_b = made_by_unit(tensor_arg(inner, 0), "aten::sub.Tensor");
  const Node* c3 = made_by(tensor_arg(inner, 1), "aten::mul.Tensor");
  const Node* a = made_by(tensor_arg(a_minus_b, 0), "aten::mul.Tensor");
  const auto b = a_minus_b ? sum_of(tensor_arg(a_minus_b, 1)) : std::nullopt;
  if (!rstd || !c3 || !a || !b || !b->keepdim) return std::nullopt;
  Value* grad_x_hat = tensor_arg(a, 0);
  Value* x_hat = tensor_arg(c3, 0);
  const auto c2 = sum_of(tensor_arg(c3, 1));
  const Node* c1 = c2 ? made_by(c2->of, "aten::mul.Tensor") : nullptr;
  if (!grad_x_hat || b->of != grad_x_hat || !c2->keepdim || c2->dims != b->dims || tensor_arg(c1, 0) != grad_x_hat || tensor_arg(c1, 1) != x_hat)
    return std::nullopt;
  const Node* normalized = made_by(x_hat, "aten::mul.Tensor");
  const Node* centered = normalized ? made_by_unit(tensor_arg(normalized, 0), "aten::sub.Tensor") : nullptr;
  if (!centered || tensor_arg(normalized, 1) != rstd) return std::nullopt;
  Value* x = tensor_arg(centered, 0);
  Value* mean = tensor_arg(centered, 1);
  const Node* forward = mean ? made_by(mean, "aten::native_layer_norm") : nullptr;
  if (!forward || tensor_arg(forward, 0) != x || forward->outputs.size() != 3 || forward->outputs[1] != mean || forward->outputs[2] != rstd)
    return std::nullopt;
  if (forward->args()[1].kind != Arg::Kind::Constant || !forward->args()[1].constant.isIntList()) return std::nullopt;  // symbolic sizes
  const std::vector<int64_t> normalized_shape = forward->args()[1].constant.toIntVector();
  const auto ndim = static_cast<int64_t>(x->meta.shape.size());
  int64_t n = 1;
  for (int64_t s : normalized_shape) n *= s;
  if (b->dims != range(ndim - static_cast<int64_t>(normalized_shape.size()), ndim) || !is_number(a, 1, static_cast<double>(n)) ||
      !is_number(scale, 1, static_cast<double>(n)))
    return std::nullopt;
  Value* weight = forward->args().size() > 2 && forward->args()[2].kind == Arg::Kind::Tensor ? forward->args()[2].values[0] : nullptr;
  Value* bias = forward->args().size() > 3 && forward->args()[3].kind == Arg::Kind::Tensor ? forward->args()[3].values[0] : nullptr;
  Value* grad_out = unweighted(grad_x_hat, weight);
  if (!grad_out || grad_out->meta.shape != x->meta.shape || grad_out->meta.dtype != x->meta.dtype) return std::nullopt;
  return LayerNormBackward{grad_out, x, x_hat, mean, rstd, weight, bias, normalized_shape};
}

bool fold_layer_norm(Graph& graph, Node* root, const std::unordered_map<const Node*, size_t>& position) {
  const auto m = match_layer_norm_backward(root);
  if (!m) return false;
  // The parameter gradients, where the decomposition computes them after d_input (the fused node
  // goes where d_input was; a sum before it would be replaced by a value made later).
  const auto ndim = static_cast<int64_t>(m->x->meta.shape.size());
  const std::vector<int64_t> outer = range(0, ndim - static_cast<int64_t>(m->normalized_shape.size()));
  auto outer_sum_after_root = [&](const Value* of) -> Node* {
    for (Node* user : of->uses()) {
      if (user->is_output()) continue;
      const auto s = sum_of(user->outputs[0]);
      if (s && s->of == of && s->dims == outer && !s->keepdim && position.at(user) > position.at(root)) return user;
    }
    return nullptr;
  };
  Node* d_weight = nullptr;
  if (m->weight)
    for (Node* user : m->x_hat->uses())
      if (user->op_name() == "aten::mul.Tensor" && tensor_arg(user, 0) == m->grad_out && tensor_arg(user, 1) == m->x_hat)
        if ((d_weight = outer_sum_after_root(user->outputs[0]))) break;
  Node* d_bias = m->bias ? outer_sum_after_root(m->grad_out) : nullptr;

  const auto optional_tensor = [](Value* v) { return v ? Arg::tensor(v) : Arg::of(c10::IValue()); };
  Node* fused = insert_fused(graph, root, root, "aten::native_layer_norm_backward",
                             {Arg::tensor(m->grad_out), Arg::tensor(m->x), Arg::ints(m->normalized_shape), Arg::tensor(m->mean),
                              Arg::tensor(m->rstd), optional_tensor(m->weight), optional_tensor(m->bias),
                              Arg::of(c10::List<bool>({true, d_weight != nullptr, d_bias != nullptr}))});
  replace(graph, root->outputs[0], fused->outputs[0]);
  if (d_weight) replace(graph, d_weight->outputs[0], fused->outputs[1]);
  if (d_bias) replace(graph, d_bias->outputs[0], fused->outputs[2]);
  return true;
}

}  // namespace

FoldedBackward fold_decomposed_backward(Graph& graph) {
  FoldedBackward folded;
  // A fold erases nodes on both sides of its root (the parameter gradients' sums come after it), so
  // after each one the walk starts over on the graph as it now is; matching is a few pointer steps.
  for (bool again = true; again;) {
    again = false;
    const std::vector<Node*> nodes = graph.nodes();
    std::unordered_map<const Node*, size_t> position;
    for (size_t i = 0; i < nodes.size(); ++i) position[nodes[i]] = i;
    for (Node* root : nodes) {
      const std::string op = root->op ? root->op_name() : "";
      if (op == "aten::sub.Tensor" && fold_softmax(graph, root)) ++folded.softmax;
      else if (op == "aten::mul.Tensor" && fold_layer_norm(graph, root, position)) ++folded.layer_norm;
      else if (op == "aten::mul.Tensor" && fold_gelu(graph, root)) ++folded.gelu;
      else continue;
      again = true;
      break;
    }
  }
  return folded;
}

}  // namespace dtensor::graph::detail
