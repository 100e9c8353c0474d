#include "bucketing.h"

#include <map>
#include <tuple>

#include "dtensor/layout.h"
#include "reshard.h"

namespace dtensor::graph::detail {
namespace {

// A chain of all-reduces (each waited for; one per mesh dim of a Partial over several) whose result
// only graph outputs use.
struct OutputAllReduce {
  std::vector<Node*> nodes;  // all_reduce, wait_tensor, all_reduce, wait_tensor, ...
  Value* input() const { return nodes.front()->args()[0].values[0]; }
  Value* result() const { return nodes.back()->outputs[0]; }
};

// The wait_tensor of an all-reduce, if it is its only user.
Node* wait_of(const Graph& graph, const Node* all_reduce) {
  const auto users = graph.users(all_reduce->outputs[0]);
  return users.size() == 1 && users[0]->op_name() == "_c10d_functional::wait_tensor" ? users[0] : nullptr;
}

bool is_all_reduce(const Node* n) { return n && n->op_name() == "_c10d_functional::all_reduce"; }

bool only_outputs_use(const Program& program, const Value* v) {
  const auto users = program.graph.users(v);
  return users.size() == 1 && users[0]->is_output();
}

// Chains of output all-reduces, by the chain's (reduce op, group) pairs and dtype, in graph order.
using Buckets = std::map<std::pair<std::vector<std::string>, int>, std::vector<OutputAllReduce>>;

// Whether `n` is fed by another all-reduce (through its wait): then it is not where a chain starts.
bool continues_a_chain(const Node* n) {
  const Node* producer = n->args()[0].values[0]->producer();
  return producer && producer->op_name() == "_c10d_functional::wait_tensor" && is_all_reduce(producer->args()[0].values[0]->producer());
}

Buckets output_chains(Program& program) {
  Graph& graph = program.graph;
  Buckets buckets;
  for (Node* n : graph.nodes()) {
    if (!is_all_reduce(n) || continues_a_chain(n)) continue;
    OutputAllReduce chain;
    std::vector<std::string> key;
    for (Node* reduce = n; reduce;) {
      Node* wait = wait_of(graph, reduce);
      if (!wait) break;
      chain.nodes.insert(chain.nodes.end(), {reduce, wait});
      key.push_back(reduce->args()[1].constant.toStringRef() + "@" + reduce->args()[2].constant.toStringRef());
      const auto users = graph.users(wait->outputs[0]);
      reduce = users.size() == 1 && is_all_reduce(users[0]) ? users[0] : nullptr;
    }
    if (chain.nodes.empty() || !only_outputs_use(program, chain.result())) continue;
    buckets[{key, static_cast<int>(chain.input()->meta.dtype)}].push_back(chain);
  }
  return buckets;
}

// The members' inputs flattened and joined into one tensor; `why` gathers the members' notes.
Value* join_inputs(Program& program, const std::vector<OutputAllReduce>& members, std::string& why) {
  std::vector<Value*> flat;
  int64_t total = 0;
  for (const OutputAllReduce& m : members) {
    Value* x = m.input();
    Node* f = program.graph.insert(nullptr, "aten::reshape", {Arg::tensor(x), Arg::ints({-1})}, x->name + "_flat");
    infer_local_metas(*f);
    flat.push_back(f->outputs[0]);
    total += numel(x->meta.shape);
    const std::string& member_note = program.annotations.note(*m.nodes.front());
    why += (why.empty() ? "" : ", ") + member_note.substr(0, member_note.find(';'));
  }
  Arg list{Arg::Kind::Tensors};
  list.values = flat;
  Node* cat = program.graph.insert(nullptr, "aten::cat", {list, Arg::of(int64_t{0})}, "bucket");
  cat->outputs[0]->meta = TensorMeta{{total}, {1}, flat[0]->meta.dtype};
  return cat->outputs[0];
}

// The same chain of all-reduces as each member's, once for the bucket.
Value* reduce_bucket(Program& program, const std::vector<OutputAllReduce>& members, Value* current, const std::string& note) {
  const TensorMeta meta = current->meta;
  for (size_t k = 0; k < members[0].nodes.size(); k += 2) {
    const Node* like = members[0].nodes[k];
    Node* reduce = program.graph.insert(nullptr, "_c10d_functional::all_reduce", {Arg::tensor(current), like->args()[1], like->args()[2]},
                                        "bucket_all_reduce");
    reduce->outputs[0]->meta = meta;
    int64_t bytes = 0;
    for (const OutputAllReduce& m : members) bytes += program.annotations.bytes_per_rank(*m.nodes[k]);
    program.annotations.set_bytes_per_rank(*reduce, bytes);
    program.annotations.set_note(*reduce, note);
    Node* wait = program.graph.insert(nullptr, "_c10d_functional::wait_tensor", {Arg::tensor(reduce->outputs[0])}, "wait_bucket");
    wait->outputs[0]->meta = meta;
    program.annotations.set_note(*wait, note);
    current = wait->outputs[0];
  }
  return current;
}

// Each member's result becomes its piece of the reduced bucket; the member's own chain goes.
void split_bucket(Program& program, const std::vector<OutputAllReduce>& members, Value* reduced) {
  Graph& graph = program.graph;
  int64_t offset = 0;
  for (const OutputAllReduce& m : members) {
    Value* before = m.result();
    const int64_t n = numel(before->meta.shape);
    Node* piece = graph.insert(nullptr, "aten::slice.Tensor", {Arg::tensor(reduced), Arg::of(int64_t{0}), Arg::of(offset), Arg::of(offset + n)},
                               before->name + "_piece");
    infer_local_metas(*piece);
    Node* shaped = graph.insert(nullptr, "aten::view", {Arg::tensor(piece->outputs[0]), Arg::ints(before->meta.shape)}, before->name + "_bucketed");
    infer_local_metas(*shaped);
    program.annotations.set_placements(*shaped->outputs[0], program.annotations.placements_of(*before));
    graph.replace_all_uses(before, shaped->outputs[0]);
    for (auto it = m.nodes.rbegin(); it != m.nodes.rend(); ++it) graph.erase(*it);
    offset += n;
  }
}

}  // namespace

int coalesce_output_all_reduces(Program& program) {
  int folded = 0;
  for (auto& [key, members] : output_chains(program)) {
    if (members.size() < 2) continue;
    std::string why;
    Value* joined = join_inputs(program, members, why);
    const std::string note = "bucket of " + std::to_string(members.size()) + " all-reduces: " + why;
    split_bucket(program, members, reduce_bucket(program, members, joined, note));
    folded += static_cast<int>(members.size());
  }
  return folded;
}

}  // namespace dtensor::graph::detail
