#include "module_kinds.h"

#include <set>

#include "dtensor/errors.h"

namespace dtensor::graph::detail {
namespace {

bool is_class(const std::string& type, const char* name) {
  const auto dot = type.rfind('.');
  return type.substr(dot == std::string::npos ? 0 : dot + 1) == name;
}

std::optional<ModuleKind> kind_of_class(const std::string& type) {
  if (is_class(type, "Linear")) return ModuleKind::Linear;
  if (is_class(type, "Conv1D")) return ModuleKind::Conv1D;
  if (is_class(type, "Embedding")) return ModuleKind::Embedding;
  return std::nullopt;
}

// Ops that pass a weight on as a view of the same values (a dtype cast included, for mixed precision;
// expand: core ATen's matmul of a batch broadcasts the weight over it before a bmm).
bool is_alias(const std::string& op) {
  static const std::set<std::string> ops = {"aten::alias", "aten::detach", "aten::_to_copy", "aten::to.dtype",
                                            "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::expand"};
  return ops.count(op) > 0;
}
bool is_transpose(const Node& n) {
  const std::string op = n.op_name();
  if (op == "aten::t" || op == "aten::transpose.int" || op == "aten::numpy_T") return true;
  return op == "aten::permute" && n.args().size() > 1 && n.args()[1].constant.isIntList() &&
         n.args()[1].constant.toIntVector() == std::vector<int64_t>{1, 0};
}
// A transpose of a batch of matrices (their last two dims).
bool is_last_two_dims_transpose(const Node& n) {
  if (n.op_name() != "aten::transpose.int" || n.args().size() < 3 || !n.args()[1].constant.isInt() || !n.args()[2].constant.isInt())
    return false;
  const std::set<int64_t> dims = {n.args()[1].constant.toInt(), n.args()[2].constant.toInt()};
  return dims == std::set<int64_t>{1, 2} || dims == std::set<int64_t>{-1, -2};
}
bool is_matmul(const std::string& op) {
  return op == "aten::mm" || op == "aten::addmm" || op == "aten::matmul" || op == "aten::bmm";
}

// Each value's readers in graph order, gathered once (Graph::users scans the whole graph per call, and
// this walks every parameter's uses).
using Readers = std::map<const Value*, std::vector<const Node*>>;

Readers readers_of(const Graph& graph) {
  Readers out;
  for (const Node* n : graph.nodes())
    for (const Value* v : n->inputs())
      if (out[v].empty() || out[v].back() != n) out[v].push_back(n);
  return out;
}

const std::vector<const Node*>& readers(const Readers& all, const Value* v) {
  static const std::vector<const Node*> none;
  const auto it = all.find(v);
  return it == all.end() ? none : it->second;
}

struct FirstUse {
  ModuleKind kind = ModuleKind::Other;
  const Node* product = nullptr;  // the node whose output is the layer's output
};

// Whether `n` selects matrices of `v` along its first dim by one index tensor (x[ids]).
bool selects_first_dim(const Node& n, const Value* v) {
  return n.op_name() == "aten::index.Tensor" && n.args().size() == 2 && n.args()[0].kind == Arg::Kind::Tensor &&
         n.args()[0].values[0] == v && n.args()[1].kind == Arg::Kind::OptionalTensors && n.args()[1].values.size() == 1;
}

// The first node in graph order that reads `weight` (forward comes first in a joint graph, so its use
// decides), followed through aliases and transposes to the op that consumes it. A 3-d weight counts
// only once its experts' matrices are selected by index, and then only as an operand of a batched
// multiply: the left one multiplies [out, in] matrices (a Linear's layout), the right one [in, out].
FirstUse first_use(const Readers& all, const Value* weight) {
  const Value* v = weight;
  bool transposed = false;
  const bool experts = weight->meta.shape.size() == 3;
  bool selected = false;
  for (int hops = 0; hops < 8; ++hops) {
    const auto& users = readers(all, v);
    if (users.empty()) return {};
    const Node* n = users.front();
    const std::string op = n->op_name();
    if (experts) {
      if (selected && op == "aten::bmm") {
        const bool left = n->args()[0].kind == Arg::Kind::Tensor && n->args()[0].values[0] == v;
        return {left != transposed ? ModuleKind::ExpertsLinear : ModuleKind::ExpertsConv1D, n};
      }
      if (!selected && selects_first_dim(*n, v) && !n->outputs.empty()) {
        selected = true;
        v = n->outputs[0];
        continue;
      }
      if (!selected) return {};
    } else {
      if (op == "aten::embedding") return {ModuleKind::Embedding, n};
      if (op == "aten::linear") return {ModuleKind::Linear, n};
      if (is_matmul(op)) return {transposed ? ModuleKind::Linear : ModuleKind::Conv1D, n};
    }
    if (experts ? is_last_two_dims_transpose(*n) : is_transpose(*n)) transposed = !transposed;
    else if (!is_alias(op)) return {};
    if (n->outputs.empty()) return {};
    v = n->outputs[0];
  }
  return {};
}

// The heads a projection's output is split into: follows views that keep the feature dim last until
// one splits it in two.
std::optional<int64_t> heads_of(const Readers& all, const Node* product) {
  if (!product || product->outputs.empty()) return std::nullopt;
  const Value* v = product->outputs[0];
  if (v->meta.shape.empty()) return std::nullopt;
  const int64_t features = v->meta.shape.back();
  for (int hops = 0; hops < 4; ++hops) {
    const auto& users = readers(all, v);
    if (users.size() != 1 || users[0]->outputs.empty()) return std::nullopt;
    const std::string op = users[0]->op_name();
    if (op != "aten::view" && op != "aten::_unsafe_view" && op != "aten::reshape") return std::nullopt;
    const Value* out = users[0]->outputs[0];
    const auto& shape = out->meta.shape;
    if (shape.empty()) return std::nullopt;
    if (shape.back() != features) {
      if (shape.size() >= 2 && shape[shape.size() - 2] * shape.back() == features) return shape[shape.size() - 2];
      return std::nullopt;
    }
    v = out;
  }
  return std::nullopt;
}

// The parameter input the graph reads for `spec`: itself, or, where torch.export kept one input for
// tied weights, the read input holding the same tensor.
const InputSpec* read_parameter(const Program& program, const Readers& all, const InputSpec& spec) {
  if (!readers(all, spec.value).empty()) return &spec;
  const auto state = program.state.find(spec.target);
  if (state == program.state.end()) return &spec;
  for (const InputSpec& other : program.inputs)
    if (other.kind == InputSpec::Kind::Parameter && &other != &spec && program.state.count(other.target) &&
        program.state.at(other.target).same_tensor(state->second) && !readers(all, other.value).empty())
      return &other;
  return &spec;
}

}  // namespace

std::string to_string(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::Linear: return "Linear";
    case ModuleKind::Conv1D: return "Conv1D";
    case ModuleKind::Embedding: return "Embedding";
    case ModuleKind::ExpertsLinear: return "experts' [expert, out, in] weight";
    case ModuleKind::ExpertsConv1D: return "experts' [expert, in, out] weight";
    case ModuleKind::Other: break;
  }
  return "other";
}

FeatureDims feature_dims(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::Linear: return {0, 1};
    case ModuleKind::Conv1D: return {1, 0};
    case ModuleKind::Embedding: return {0, 1};
    case ModuleKind::ExpertsLinear: return {1, 2};
    case ModuleKind::ExpertsConv1D: return {2, 1};
    case ModuleKind::Other: break;
  }
  throw DTensorError("internal: feature_dims of a module that is no layer");
}

std::map<std::string, ModuleInfo> program_modules(const Program& program) {
  std::map<std::string, ModuleInfo> out;
  for (const Node* n : program.graph.nodes())
    if (!n->module_path.empty()) out[n->module_path].type = n->module_type;
  const std::string suffix = ".weight";
  const Readers all = readers_of(program.graph);
  std::map<const Value*, int> modules_per_weight;
  for (const InputSpec& spec : program.inputs) {
    const std::string& name = spec.target;
    if (spec.kind != InputSpec::Kind::Parameter) continue;
    const auto dot = name.rfind('.');
    const std::string owner = dot == std::string::npos ? "" : name.substr(0, dot);
    if (spec.value->meta.shape.size() == 3) {  // perhaps experts' weights, listed under their own name
      const FirstUse use = first_use(all, spec.value);
      if (use.kind == ModuleKind::Other) continue;
      ModuleInfo& info = out[name];
      info.kind = use.kind;
      info.weight = spec.value;
      info.weight_name = info.bias_name = name;
      info.bias_name += "_bias";
      continue;
    }
    ModuleInfo& info = out[owner];
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const InputSpec& read = *read_parameter(program, all, spec);
    info.weight = read.value;
    info.weight_name = read.target;
    info.bias_name = owner + ".bias";
    ++modules_per_weight[read.value];
    if (read.value->meta.shape.size() != 2) continue;
    const FirstUse use = first_use(all, read.value);
    info.kind = use.kind;
    info.heads = heads_of(all, use.product);
  }
  for (const auto& [path, info] : out) {
    const auto declared = kind_of_class(info.type);
    if (declared && info.weight && modules_per_weight[info.weight] == 1 && *declared != info.kind)
      throw DTensorError("module " + path + " is a " + info.type + ", but the graph uses its weight " +
                         c10::Join("x", info.weight->meta.shape) + " as " +
                         (info.kind == ModuleKind::Other       ? std::string("no layer does")
                          : info.kind == ModuleKind::Embedding ? std::string("an Embedding would")
                                                               : "a " + to_string(info.kind) + " would") +
                         ": dtensor cannot tell how to shard it; export the model without rewriting this layer");
  }
  return out;
}

}  // namespace dtensor::graph::detail
