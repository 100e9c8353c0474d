#include "lowerings.h"

#include "../sharding/rules/squeezed_dims.h"
#include "reshard.h"

namespace dtensor::graph::detail {
namespace {

// Inserts local ops before `at`, described as part of `at`'s computation.
struct Builder {
  Program& program;
  Node* at;
  std::string note;

  Value* op(const std::string& qualified, std::vector<Arg> args, const std::string& name) {
    Node* n = program.graph.insert(at, qualified, std::move(args), name);
    n->module_path = at->module_path;
    n->module_type = at->module_type;
    n->metadata = at->metadata;
    program.annotations.set_note(*n, note);
    infer_local_metas(*n);
    return n->outputs[0];
  }
};

// embedding(weight Shard(0) over the vocabulary, indices): this rank looks up the indices in its rows
// [lo, lo + rows) and gives zeros for the others, so the ranks' results add up (Partial(sum)).
Replacements lower_row_sharded_embedding(Program& program, const DeviceMesh& mesh, Node* node, const GlobalMeta& global) {
  Value* weight = node->args[0].values[0];
  Value* indices = node->args[1].values[0];
  const Placements& placements = program.annotations.placements_of(*weight);
  bool rows_sharded = false;
  for (const auto& p : placements) rows_sharded = rows_sharded || p.is_shard(0);
  if (!rows_sharded) return {};
  const LocalLayout part = local_layout(global(weight).shape, mesh.shape(), *mesh.coordinate(), placements);
  const int64_t lo = part.offset[0], rows = part.shape[0];
  Builder b{program, node, "vocabulary-sharded lookup: rows " + std::to_string(lo) + ".." + std::to_string(lo + rows)};
  Value* held = b.op("aten::logical_and",
                     {Arg::tensor(b.op("aten::ge.Scalar", {Arg::tensor(indices), Arg::of(lo)}, "from_lo")),
                      Arg::tensor(b.op("aten::lt.Scalar", {Arg::tensor(indices), Arg::of(lo + rows)}, "below_hi"))},
                     "held");
  Value* looked = nullptr;
  if (rows == 0) {
    std::vector<int64_t> shape = indices->meta.shape;
    shape.push_back(weight->meta.shape[1]);
    looked = b.op("aten::new_zeros", {Arg::tensor(weight), Arg::ints(shape)}, "none_held");
  } else {
    Value* shifted = b.op("aten::sub.Scalar", {Arg::tensor(indices), Arg::of(lo)}, "local_index");
    Value* index = b.op("aten::where.ScalarOther", {Arg::tensor(held), Arg::tensor(shifted), Arg::of(int64_t{0})}, "held_index");
    std::vector<Arg> args = node->args;
    args[1] = Arg::tensor(index);
    looked = b.op("aten::embedding", std::move(args), "local_lookup");
    Value* missing = b.op("aten::logical_not", {Arg::tensor(b.op("aten::unsqueeze", {Arg::tensor(held), Arg::of(int64_t{-1})}, "held_rows"))},
                          "missing");
    looked = b.op("aten::masked_fill.Scalar", {Arg::tensor(looked), Arg::tensor(missing), Arg::of(0.0)}, "lookup");
  }
  Value* out = node->outputs[0];
  program.annotations.set_placements(*looked, program.annotations.placements_of(*out));
  program.graph.replace_all_uses(out, looked);
  program.graph.erase(node);
  return {{out, looked}};
}

// squeeze (any overload) on local shards: squeeze.dims of the dims that are 1 in the global shape
// (what the squeeze rule's local kernel runs), so that a sharded dim 1 in this shard only stays.
Replacements lower_squeeze(Program& program, Node* node, const GlobalMeta& global) {
  Value* self = node->args[0].values[0];
  const std::vector<int64_t> dims =
      rules::globally_squeezed_dims(global(self).shape, node->args.size() > 1 ? &node->args[1].constant : nullptr);
  Builder b{program, node, "squeeze of the dims that are 1 in the global shape"};
  Value* squeezed = b.op("aten::squeeze.dims", {Arg::tensor(self), Arg::ints(dims)}, node->name);
  Value* out = node->outputs[0];
  program.annotations.set_placements(*squeezed, program.annotations.placements_of(*out));
  program.graph.replace_all_uses(out, squeezed);
  program.graph.erase(node);
  return {{out, squeezed}};
}

}  // namespace

Replacements lower_local_kernel(Program& program, const DeviceMesh& mesh, Node* node, const GlobalMeta& global) {
  const std::string op = node->op_name();
  if (op == "aten::embedding") return lower_row_sharded_embedding(program, mesh, node, global);
  if (op == "aten::squeeze" || op == "aten::squeeze.dim" || op == "aten::squeeze.dims") return lower_squeeze(program, node, global);
  return {};
}

}  // namespace dtensor::graph::detail
