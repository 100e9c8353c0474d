#include "sym_sizes.h"

#include "dtensor/errors.h"
#include "dtensor/layout.h"
#include "integer_ops.h"

namespace dtensor::graph::detail {
namespace {

// What a node reads of a tensor's size, if it is a size query.
enum class SizeQuery { None, Size, Numel, Stride };
SizeQuery size_query(const Node& node) {
  if (!node.op) return SizeQuery::None;
  const std::string name = node.op_name();
  if (name == "aten::sym_size.int") return SizeQuery::Size;
  if (name == "aten::sym_numel") return SizeQuery::Numel;
  if (name == "aten::sym_stride.int") return SizeQuery::Stride;
  return SizeQuery::None;
}

// The dim a sym_size / sym_stride node reads, normalised against `ndim`.
int64_t queried_dim(const Node& node, int64_t ndim) {
  const int64_t d = node.args()[1].constant.toInt();
  return d < 0 ? d + ndim : d;
}

std::string list_str(const std::vector<int64_t>& v) {
  std::string out;
  for (int64_t x : v) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return "[" + out + "]";
}

}  // namespace

const ShardedSizes::Info* ShardedSizes::info(const Value* v) const {
  auto it = sharded_.find(v);
  return it == sharded_.end() ? nullptr : &it->second;
}

void ShardedSizes::record(const Node& node, const Annotations& marks) {
  if (node.outputs.size() != 1 || node.outputs[0]->is_tensor()) return;
  Value* out = node.outputs[0];
  if (node.op) {
    const SizeQuery query = size_query(node);
    if (query == SizeQuery::None) return;
    const bool numel = query == SizeQuery::Numel;
    const Value& source = *node.args()[0].values[0];
    const int64_t dim = numel ? -1 : queried_dim(node, static_cast<int64_t>(source.meta.shape.size()));
    Info i;
    for (int64_t m = 0; m < mesh_->ndim(); ++m) {
      const Placement& p = marks.placements_of(source)[m];
      if (p.is_shard() && (numel || p.dim() == dim)) {
        i.mesh_dims.push_back(m);
        i.shards *= mesh_->size(m);
      }
    }
    // A local stride is not a chunk of the global one.
    i.scalable = query != SizeQuery::Stride;
    if (!i.mesh_dims.empty()) sharded_[out] = i;
    return;
  }
  // An integer operator: a product with a whole size stays a chunk (of a dim that many times longer);
  // sums, quotients and remainders of a local size are neither local nor global sizes.
  std::vector<const Info*> operands;
  for (const Arg& a : node.args())
    if (a.kind == Arg::Kind::SymInt && a.sizes[0].symbol)
      if (const Info* i = info(a.sizes[0].symbol)) operands.push_back(i);
  if (operands.empty()) return;
  Info i = *operands[0];
  i.scalable = operands.size() == 1 && operands[0]->scalable && node.target == "_operator.mul";
  for (size_t k = 1; k < operands.size(); ++k)
    i.mesh_dims.insert(i.mesh_dims.end(), operands[k]->mesh_dims.begin(), operands[k]->mesh_dims.end());
  sharded_[out] = i;
}

std::optional<std::pair<Placements, size_t>> ShardedSizes::factory_placements(const Node& node) const {
  if (node.outputs.empty() || !node.outputs[0]->is_tensor()) return std::nullopt;
  const size_t ndim = node.outputs[0]->meta.shape.size();
  for (size_t index = 0; index < node.args().size(); ++index) {
    const Arg& a = node.args()[index];
    if (a.kind != Arg::Kind::SymInts || a.sizes.size() != ndim) continue;
    Placements p(mesh_->ndim(), Replicate());
    bool sharded = false;
    for (size_t d = 0; d < a.sizes.size(); ++d) {
      const Info* i = a.sizes[d].symbol ? info(a.sizes[d].symbol) : nullptr;
      if (!i) continue;
      if (!i->scalable)
        throw DTensorError("graph: node '" + node.name + "' (" + node.op_name() + "): its size %" + a.sizes[d].symbol->name +
                           " is computed from a sharded size by an operator that makes it neither this rank's part nor "
                           "the whole; place the dim it is read from Replicate");
      for (int64_t m : i->mesh_dims) {
        if (!p[m].is_replicate())
          throw DTensorError("graph: node '" + node.name + "' (" + node.op_name() + "): sizes of two dims are sharded along mesh dim " +
                             std::to_string(m) + "; a factory output can be sharded along one dim per mesh dim");
        p[m] = Shard(static_cast<int64_t>(d));
      }
      sharded = true;
    }
    if (sharded) return std::make_pair(p, index);
  }
  return std::nullopt;
}

void ShardedSizes::compute_local_hints(const Graph& graph) {
  auto hint = [&](const SymSize& s) {
    if (!s.symbol) return s.value;
    auto it = local_hint_.find(s.symbol);
    return it != local_hint_.end() ? it->second : s.symbol->sym_hint;
  };
  for (const Node* node : graph.nodes()) {
    if (node->outputs.size() != 1 || node->outputs[0]->is_tensor()) continue;
    const Value* out = node->outputs[0];
    if (!node->op) {
      std::vector<int64_t> operands;
      for (const Arg& a : node->args()) operands.push_back(a.kind == Arg::Kind::SymInt ? hint(a.sizes[0]) : a.constant.toInt());
      local_hint_[out] = apply_integer_operator(node->target, operands, "graph: node '" + node->name + "'");
      continue;
    }
    const SizeQuery query = size_query(*node);
    if (query == SizeQuery::None) continue;
    const TensorMeta& local = node->args()[0].values[0]->meta;
    if (query == SizeQuery::Numel) local_hint_[out] = numel(local.shape);
    else {
      const int64_t d = queried_dim(*node, static_cast<int64_t>(local.shape.size()));
      local_hint_[out] = query == SizeQuery::Size ? local.shape.at(d) : local.stride.at(d);
    }
  }
}

Value* ShardedSizes::global_value(Program& program, Node* before, Value* symbol) {
  if (auto it = global_of_.find(symbol); it != global_of_.end()) return it->second;
  const Info& i = *info(symbol);
  Arg local{Arg::Kind::SymInt};
  local.sizes = {SymSize{0, symbol}};
  Node* n = program.graph.insert_integer_operator(before, "mul", {local, Arg::of(i.shards)}, symbol->name + "_global");
  program.annotations.set_note(*n, "the global value of a size read from a dim sharded " + std::to_string(i.shards) + " ways");
  Value* out = n->outputs[0];
  out->sym_hint = symbol->sym_hint;
  local_hint_[out] = symbol->sym_hint;
  return global_of_[symbol] = out;
}

void ShardedSizes::localize_argument(Program& program, Node* node, size_t index, const c10::IValue& wanted) {
  Graph& graph = program.graph;
  Arg a = node->args()[index];
  const bool list = a.kind == Arg::Kind::SymInts;
  if (!list && a.kind != Arg::Kind::SymInt) return graph.set_arg(node, index, Arg::of(wanted));
  const std::vector<int64_t> want = wanted.isIntList() ? wanted.toIntVector() : std::vector<int64_t>{wanted.toInt()};
  auto fail = [&](const std::string& why) {
    throw DTensorError("graph: node '" + node->name + "' (" + node->op_name() + "): " + why + " (its sizes on this rank must be " +
                       list_str(want) + ")");
  };
  if (want.size() != a.sizes.size()) fail("a size argument computed at run time changes length on this rank");
  bool symbolic = false;
  for (size_t d = 0; d < a.sizes.size(); ++d) {
    SymSize& s = a.sizes[d];
    if (!s.symbol) {
      s.value = want[d];
      continue;
    }
    const auto local = local_hint_.find(s.symbol);
    const int64_t here = local == local_hint_.end() ? s.symbol->sym_hint : local->second;
    const Info* i = info(s.symbol);
    if (here == want[d]) {
      symbolic = true;
    } else if (i && i->scalable && s.symbol->sym_hint == want[d] && here * i->shards == want[d]) {
      s.symbol = global_value(program, node, s.symbol);
      symbolic = true;
    } else {
      fail("size %" + s.symbol->name + " is " + std::to_string(here) + " on this rank, and neither it nor its global value " +
           std::to_string(s.symbol->sym_hint) + " is what the op needs here");
    }
  }
  graph.set_arg(node, index, symbolic ? std::move(a) : list ? Arg::of(want) : Arg::of(want[0]));
}

}  // namespace dtensor::graph::detail
