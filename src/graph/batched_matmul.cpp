#include "batched_matmul.h"

#include <optional>

#include "dead_code.h"
#include "reshard.h"

namespace dtensor::graph::detail {
namespace {

bool is_view(const Node* n) {
  if (!n || !n->op) return false;
  const std::string name = n->op_name();
  return name == "aten::view" || name == "aten::_unsafe_view" || name == "aten::reshape";
}

bool is_transpose_of_last_two(const Node* n) {
  if (!n || !n->op || n->op_name() != "aten::permute") return false;
  const c10::IValue& dims = n->args()[1].constant;
  return dims.isIntList() && dims.toIntVector() == std::vector<int64_t>{0, 2, 1};
}

// The 4-d value [B, H, a, b] whose first two dims `v` ([B*H, a, b]) merges, if a view made it.
Value* merged_from(Value* v) {
  Node* n = v->producer();
  if (!is_view(n) || v->meta.shape.size() != 3) return nullptr;
  Value* x = n->args()[0].values[0];
  const Shape& s = x->meta.shape;
  if (s.size() != 4 || s[0] * s[1] != v->meta.shape[0] || s[2] != v->meta.shape[1] || s[3] != v->meta.shape[2]) return nullptr;
  return x;
}

// A bmm operand as a 4-d value: a merged view's source, or (transpose set) the transpose of the
// last two dims of one.
struct Operand {
  Value* source = nullptr;
  const Node* transpose = nullptr;
};
std::optional<Operand> operand_of(Value* v) {
  if (Value* x = merged_from(v)) return Operand{x, nullptr};
  const Node* n = v->producer();
  if (!is_transpose_of_last_two(n)) return std::nullopt;
  if (Value* x = merged_from(n->args()[0].values[0])) return Operand{x, n};
  return std::nullopt;
}

// The operand's 4-d value, a 4-d transpose made before `at` where it is one.
Value* operand_4d(Graph& graph, Node* at, const Operand& o) {
  if (!o.transpose) return o.source;
  Node* t = InsertionScope(graph, at, o.transpose).insert("aten::permute", {Arg::tensor(o.source), Arg::ints({0, 1, 3, 2})}, o.transpose->name + "_4d");
  infer_local_metas(*t);
  return t->outputs[0];
}

}  // namespace

int lift_merged_batch_matmuls(Graph& graph) {
  // The bmms first: lifting one erases its split view, a node further down the graph, so a walk over
  // every node would reach it after it was freed. Lifting erases nothing downstream of a later bmm.
  std::vector<Node*> bmms;
  for (Node* n : graph.nodes())
    if (n->op && n->op_name() == "aten::bmm") bmms.push_back(n);
  int lifted = 0;
  for (Node* bmm : bmms) {
    const auto users = graph.users(bmm->outputs[0]);
    if (users.size() != 1 || !is_view(users[0])) continue;
    Node* split = users[0];
    Value* a = bmm->args()[0].values[0];
    Value* b = bmm->args()[1].values[0];
    const Shape& out = split->outputs[0]->meta.shape;
    if (out.size() != 4) continue;
    // Both operands must merge the same [B, H] as the split restores.
    const auto a_operand = operand_of(a), b_operand = operand_of(b);
    auto batch_of = [](const Operand& o) { return Shape{o.source->meta.shape[0], o.source->meta.shape[1]}; };
    const Shape batch{out[0], out[1]};
    if (!a_operand || !b_operand || batch_of(*a_operand) != batch || batch_of(*b_operand) != batch) continue;
    Value* a4 = operand_4d(graph, split, *a_operand);
    Value* b4 = operand_4d(graph, split, *b_operand);
    Node* matmul = InsertionScope(graph, split, bmm).insert("aten::matmul", {Arg::tensor(a4), Arg::tensor(b4)}, bmm->name + "_4d");
    infer_local_metas(*matmul);
    graph.replace_all_uses(split->outputs[0], matmul->outputs[0]);
    graph.erase(split);
    graph.erase(bmm);
    erase_if_unused(graph, a);
    erase_if_unused(graph, b);
    ++lifted;
  }
  return lifted;
}

}  // namespace dtensor::graph::detail
