#include "reshard.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "dtensor/errors.h"
#include "meta_tensor.h"
#include "dtensor/redistribute_plan.h"
#include "process_groups.h"

namespace dtensor::graph::detail {
namespace {

// Builds the nodes of one reshard on this rank, keeping track of the current (local) value.
struct Emitter {
  Program& program;
  const MeshPtr& mesh;
  Node* before;
  std::string why;
  Value* current;
  const RedistributeStep* step = nullptr;  // the planner's step being emitted
  const Value* source = nullptr;           // the value resharded (its dynamic dims)
  bool rows_permuted = false;              // a gathered or scattered dim moved back by a view

  bool dynamic_dim(int64_t d) const {
    return static_cast<size_t>(d) < source->symbolic_sizes.size() && !source->symbolic_sizes[d].empty();
  }

  Node* emit(const std::string& op, std::vector<Arg> args, const std::string& name) {
    Node* n = InsertionScope(program.graph, before).insert(op, std::move(args), name);
    program.annotations.set_note(*n, why);
    return n;
  }

  // A node whose output meta its op's Meta kernel gives.
  Value* local(const std::string& op, std::vector<Arg> args, const std::string& name) {
    Node* n = emit(op, std::move(args), name);
    infer_local_metas(*n);
    return current = n->outputs[0];
  }

  std::string group(int64_t mesh_dim) {
    if (mesh->planning_only()) return group_name(*mesh, mesh_dim);  // a program to read, not to run
    auto g = group_for(*mesh, mesh_dim);
    program.process_groups.push_back(g);
    return g->name();
  }

  // A collective producing a contiguous tensor of `shape`, then its wait_tensor.
  Value* collective(const std::string& op, std::vector<Arg> args, const Shape& shape, const std::string& name) {
    Node* n = emit(op, std::move(args), name);
    program.annotations.set_note(*n, why + "; " + step->str());
    program.annotations.set_bytes_per_rank(*n, step->bytes_per_rank);
    Value* out = n->outputs[0];
    out->meta = TensorMeta{shape, contiguous_strides(shape), current->meta.dtype};
    Node* wait = emit("_c10d_functional::wait_tensor", {Arg::tensor(out)}, "wait_" + n->name);
    wait->outputs[0]->meta = out->meta;
    return current = wait->outputs[0];
  }

  void contiguous() {
    const Shape dense = contiguous_strides(current->meta.shape);
    bool is_dense = true;
    for (size_t d = 0; d < dense.size(); ++d) is_dense = is_dense && (current->meta.shape[d] <= 1 || current->meta.stride[d] == dense[d]);
    if (!is_dense) local("aten::clone", {Arg::tensor(current), Arg::of(c10::MemoryFormat::Contiguous)}, "contiguous");
  }

  // Dim `d` to the front (a permute), and its inverse.
  static std::vector<int64_t> front(int64_t d, int64_t ndim) {
    std::vector<int64_t> p = {d};
    for (int64_t i = 0; i < ndim; ++i)
      if (i != d) p.push_back(i);
    return p;
  }
  static std::vector<int64_t> inverse(const std::vector<int64_t>& p) {
    std::vector<int64_t> inv(p.size());
    for (size_t i = 0; i < p.size(); ++i) inv[static_cast<size_t>(p[i])] = static_cast<int64_t>(i);
    return inv;
  }

  void rows_first(int64_t d) {
    if (d != 0) local("aten::permute", {Arg::tensor(current), Arg::ints(front(d, current->meta.shape.size()))}, "rows_first");
  }
  // Left a view for lay_out_as to copy once into the value's layout (the next collective makes it
  // contiguous itself).
  void rows_back(int64_t d) {
    if (d == 0) return;
    local("aten::permute", {Arg::tensor(current), Arg::ints(inverse(front(d, current->meta.shape.size())))}, "rows_back");
    rows_permuted = true;
  }

  // Dims from the outermost in memory to the innermost: by stride, larger first (ties in dim order).
  static std::vector<int64_t> memory_order(const Shape& stride) {
    std::vector<int64_t> order(stride.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return stride[a] > stride[b]; });
    return order;
  }
  // Whether the current value's dims lie in memory in `order`, among the dims longer than 1 here and in
  // `global` (a dim of one element may have any stride).
  bool laid_out_in(const std::vector<int64_t>& order, const Shape& global_shape) const {
    std::vector<int64_t> want, have;
    for (int64_t d : order)
      if (current->meta.shape[d] > 1 && global_shape[d] > 1) want.push_back(d);
    for (int64_t d : memory_order(current->meta.stride))
      if (current->meta.shape[d] > 1 && global_shape[d] > 1) have.push_back(d);
    return want == have;
  }

  // The resharded value laid out as the program's value is (its global strides' order, dense): views
  // later in the program rely on it (a transposed attention output viewed back to [batch, positions,
  // hidden]), while collectives return their rows contiguous. One copy, where the layout differs or the
  // rows were permuted back.
  void lay_out_as(const TensorMeta& global) {
    if (current->meta.shape.size() < 2) return;
    const std::vector<int64_t> order = memory_order(global.stride);
    if (laid_out_in(order, global.shape)) {
      if (rows_permuted) contiguous_in_its_order();
      return;
    }
    if (std::is_sorted(order.begin(), order.end())) return contiguous();
    local("aten::permute", {Arg::tensor(current), Arg::ints(order)}, "in_memory_order");
    local("aten::clone", {Arg::tensor(current), Arg::of(c10::MemoryFormat::Contiguous)}, "laid_out");
    local("aten::permute", {Arg::tensor(current), Arg::ints(inverse(order))}, "as_the_program_lays_it_out");
  }
  // A dense copy keeping the dims' order in memory (clone's preserve format: strides kept where dense).
  void contiguous_in_its_order() {
    local("aten::clone", {Arg::tensor(current), Arg::of(c10::MemoryFormat::Preserve)}, "dense");
  }
  // Zero rows appended along dim 0 up to `rows` (uneven shards travel padded to equal size).
  void pad_rows(int64_t rows) {
    const int64_t have = current->meta.shape.at(0);
    if (have < rows) {
      std::vector<int64_t> pad(2 * current->meta.shape.size(), 0);
      pad.back() = rows - have;  // pairs run from the last dim to the first
      local("aten::constant_pad_nd", {Arg::tensor(current), Arg::ints(pad)}, "pad");
    }
    contiguous();
  }
  void keep_rows(int64_t offset, int64_t rows) {
    if (offset == 0 && rows == current->meta.shape.at(0)) return;
    local("aten::slice.Tensor", {Arg::tensor(current), Arg::of(int64_t{0}), Arg::of(offset), Arg::of(offset + rows)}, "unpad");
  }

  static std::string reduce_name(ReduceOp op) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return "sum";  // Gloo has no average: sum, then divide
      case ReduceOp::Max: return "max";
      case ReduceOp::Min: return "min";
    }
    return "sum";
  }
  void divide_for_average(ReduceOp op, int64_t n) {
    if (op != ReduceOp::Avg) return;
    const bool integral = at::isIntegralType(current->meta.dtype, /*includeBool=*/true);
    if (integral)
      local("aten::div.Scalar_mode", {Arg::tensor(current), Arg::of(n), Arg::of(std::string("trunc"))}, "average");
    else
      local("aten::div.Scalar", {Arg::tensor(current), Arg::of(n)}, "average");
  }

  // A StridedShard(d, sf) gathered: each rank holds its piece of every one of the sf blocks, so the
  // gathered rows come rank by rank and are reordered block by block. Even pieces only.
  void all_gather_strided(const RedistributeStep& step) {
    const int64_t d = step.from.dim(), n = mesh->size(step.mesh_dim), sf = step.from.split_factor();
    const int64_t length = step.logical_shape[d], piece = length / sf / n;
    if (length % (sf * n) != 0) refuse_strided(step, "its blocks do not split evenly over the ranks");
    rows_first(d);
    contiguous();
    Shape shape = current->meta.shape;
    shape[0] = length;
    collective("_c10d_functional::all_gather_into_tensor",
               {Arg::tensor(current), Arg::of(n), Arg::of(group(step.mesh_dim))}, shape, "all_gather");
    Shape split = {n, sf, piece};
    split.insert(split.end(), shape.begin() + 1, shape.end());
    local("aten::view", {Arg::tensor(current), Arg::ints(split)}, "rank_blocks");
    local("aten::transpose.int", {Arg::tensor(current), Arg::of(int64_t{0}), Arg::of(int64_t{1})}, "block_ranks");
    contiguous();
    local("aten::view", {Arg::tensor(current), Arg::ints(shape)}, "blocks");
    rows_back(d);
  }

  // This rank's piece of every block of dim d, side by side: the StridedShard(d, sf) of a whole value.
  void local_chunk_strided(const RedistributeStep& step) {
    const int64_t d = step.to.dim(), sf = step.to.split_factor(), length = current->meta.shape[d];
    if (length % sf != 0) refuse_strided(step, "the dim is no whole number of blocks");
    const ChunkExtent c = strided_block_chunk(length, sf, mesh->size(step.mesh_dim), (*mesh->coordinate())[step.mesh_dim]);
    Value* whole = current;
    std::vector<Value*> pieces;
    for (int64_t b = 0; b < sf; ++b) {
      const int64_t start = b * (length / sf) + c.offset;
      pieces.push_back(local("aten::slice.Tensor", {Arg::tensor(whole), Arg::of(d), Arg::of(start), Arg::of(start + c.size)}, "block"));
    }
    local("aten::cat", {Arg{Arg::Kind::Tensors, {}, pieces}, Arg::of(d)}, "strided_chunk");
  }

  [[noreturn]] void refuse_strided(const RedistributeStep& step, const std::string& reason) {
    throw DTensorError("graph: " + why + ": %" + source->name + " would move " + step.str() +
                       " with a strided shard, which graph programs do only between StridedShard and Replicate with even pieces (" +
                       reason + ")");
  }

  void all_gather(const RedistributeStep& step) {
    if (step.from.is_strided_shard()) return all_gather_strided(step);
    const int64_t d = step.from.dim(), n = mesh->size(step.mesh_dim), length = step.logical_shape[d];
    const int64_t padded = padded_chunk_size(length, n);
    // A dynamic dim is sharded evenly: no padding to add, none to trim (either would fix its size).
    const bool even = dynamic_dim(d);
    rows_first(d);
    if (even) contiguous();
    else pad_rows(padded);
    Shape shape = current->meta.shape;
    shape[0] = padded * n;
    collective("_c10d_functional::all_gather_into_tensor",
               {Arg::tensor(current), Arg::of(n), Arg::of(group(step.mesh_dim))}, shape, "all_gather");
    if (!even) keep_rows(0, length);  // chunks are full-size before the short and empty ones
    rows_back(d);
  }

  void all_reduce(const RedistributeStep& step) {
    contiguous();
    const ReduceOp op = step.from.reduce_op();
    collective("_c10d_functional::all_reduce", {Arg::tensor(current), Arg::of(reduce_name(op)), Arg::of(group(step.mesh_dim))},
               current->meta.shape, "all_reduce");
    divide_for_average(op, mesh->size(step.mesh_dim));
  }

  void reduce_scatter(const RedistributeStep& step) {
    const int64_t d = step.to.dim(), n = mesh->size(step.mesh_dim);
    const int64_t length = current->meta.shape[d], padded = padded_chunk_size(length, n);
    const ReduceOp op = step.from.reduce_op();
    rows_first(d);
    pad_rows(padded * n);
    Shape shape = current->meta.shape;
    shape[0] = padded;
    collective("_c10d_functional::reduce_scatter_tensor",
               {Arg::tensor(current), Arg::of(reduce_name(op)), Arg::of(n), Arg::of(group(step.mesh_dim))}, shape,
               "reduce_scatter");
    divide_for_average(op, n);
    keep_rows(0, chunk_extent(length, n, (*mesh->coordinate())[step.mesh_dim]).size);
    rows_back(d);
  }

  void local_chunk(const RedistributeStep& step) {
    const int64_t d = step.to.dim();
    const ChunkExtent c = chunk_extent(current->meta.shape[d], mesh->size(step.mesh_dim), (*mesh->coordinate())[step.mesh_dim]);
    local("aten::slice.Tensor", {Arg::tensor(current), Arg::of(d), Arg::of(c.offset), Arg::of(c.offset + c.size)}, "chunk");
  }

  void local_partition(const RedistributeStep& step) {
    // Sum: the first rank keeps the value, the others contribute zero; the other reductions of equal
    // copies are the copy.
    if (step.to.reduce_op() == ReduceOp::Sum && (*mesh->coordinate())[step.mesh_dim] != 0)
      local("aten::zeros_like", {Arg::tensor(current)}, "partition");
  }

  void local_pad(const RedistributeStep& step) {
    const auto pad = step.pad_to_whole(static_cast<int64_t>(current->meta.shape.size()), mesh->size(step.mesh_dim),
                                       (*mesh->coordinate())[step.mesh_dim]);
    local("aten::constant_pad_nd", {Arg::tensor(current), Arg::ints(pad), Arg::of(0.0)}, "padded");
  }

  void run(const RedistributeStep& step) {
    this->step = &step;
    // Along a mesh dim of one rank every step is the identity (a gather, reduction or chunk of one).
    if (mesh->size(step.mesh_dim) == 1) return;
    const bool gather_strided = step.kind == StepKind::AllGather && step.to.is_replicate();
    const bool chunk_strided = step.kind == StepKind::LocalChunk && step.from.is_replicate();
    if (step.from.is_head_tail_shard() || step.to.is_head_tail_shard()) refuse_strided(step, "head-tail shards have no graph form yet");
    if ((step.from.is_strided_shard() && !gather_strided) || (step.to.is_strided_shard() && !chunk_strided))
      refuse_strided(step, "this step is neither a gather to Replicate nor a chunk of a Replicate value");
    if (step.kind == StepKind::LocalChunk && step.to.is_strided_shard()) return local_chunk_strided(step);
    switch (step.kind) {
      case StepKind::AllGather: all_gather(step); break;
      case StepKind::AllReduce: all_reduce(step); break;
      case StepKind::ReduceScatter: reduce_scatter(step); break;
      case StepKind::LocalChunk: local_chunk(step); break;
      case StepKind::LocalPartition: local_partition(step); break;
      case StepKind::LocalPad: local_pad(step); break;
      case StepKind::AllToAll: {
        // S(i) -> S(j) as a gather along i then a chunk along j (more bytes than an all-to-all, which
        // functional collectives express with sizes only known per rank; a later improvement).
        RedistributeStep gather = step, chunk = step;
        gather.kind = StepKind::AllGather;
        gather.to = Replicate();
        chunk.kind = StepKind::LocalChunk;
        chunk.from = Replicate();
        all_gather(gather);
        local_chunk(chunk);
        break;
      }
    }
  }
};

}  // namespace

void infer_local_metas(Node& node) {
  // On Meta stand-ins where the op has a Meta kernel, else (logical_and has none in C++) on CPU
  // stand-ins: one zero expanded to the shape, so the op costs little.
  for (const bool on_meta : {true, false}) {
    torch::jit::Stack stack;
    auto stand_in = [&](const Value& v) {
      return on_meta ? meta_tensor(v) : at::zeros({}, at::TensorOptions().dtype(v.meta.dtype)).expand(v.meta.shape);
    };
    for (const Arg& a : node.args()) {
      if (a.kind == Arg::Kind::Constant || a.kind == Arg::Kind::Number) {
        stack.push_back(a.constant);
      } else if (a.kind == Arg::Kind::SymInt || a.kind == Arg::Kind::SymInts) {  // sizes at their example values
        std::vector<int64_t> hints;
        for (const SymSize& s : a.sizes) hints.push_back(s.hint());
        stack.push_back(a.kind == Arg::Kind::SymInt ? c10::IValue(hints[0]) : c10::IValue(hints));
      } else if (a.kind == Arg::Kind::Tensor) {
        stack.emplace_back(stand_in(*a.values[0]));
      } else if (a.kind == Arg::Kind::Tensors) {  // a cat's pieces
        std::vector<at::Tensor> list;
        for (const Value* v : a.values) list.push_back(stand_in(*v));
        stack.emplace_back(list);
      } else {
        throw DTensorError("graph: cannot infer the meta of node " + node.name + " (unsupported argument)");
      }
    }
    try {
      node.op->callBoxed(stack);
    } catch (const c10::NotImplementedError&) {
      if (on_meta) continue;
      throw;
    }
    for (size_t k = 0; k < node.outputs.size() && k < stack.size(); ++k) {
      const at::Tensor& t = stack[k].toTensor();
      node.outputs[k]->meta = TensorMeta{t.sizes().vec(), on_meta ? t.strides().vec() : contiguous_strides(t.sizes().vec()),
                                         t.scalar_type()};
    }
    return;
  }
}

Value* insert_reshard(Program& program, const MeshPtr& mesh, Node* before, Value* value, const TensorMeta& global,
                      const Placements& to, const std::string& why) {
  const Placements from = program.annotations.placements_of(*value);
  const auto plan = plan_redistribute(global.shape, static_cast<int64_t>(c10::elementSize(global.dtype)), mesh->shape(),
                                      *mesh->coordinate(), from, to);
  // A step that cuts a dim whose size is dynamic would bake the example's size into the program
  // (chunk bounds): refused rather than wrong at another size. Gathering one is fine: dynamic dims are
  // sharded evenly (spmd.h), so the pieces need no padding and the whole no trimming.
  auto dynamic = [&](const Placement& p) {
    return p.is_shard() && static_cast<size_t>(p.dim()) < value->symbolic_sizes.size() && !value->symbolic_sizes[p.dim()].empty();
  };
  for (const auto& step : plan.steps) {
    if (mesh->size(step.mesh_dim) == 1 || (step.kind == StepKind::AllGather && !dynamic(step.to))) continue;
    for (const Placement& p : {step.from, step.to})
      if (dynamic(p))
        throw DTensorError("graph: " + why + ": %" + value->name + " would be cut along its dim " + std::to_string(p.dim()) +
                           ", whose size is dynamic (" + value->symbolic_sizes[p.dim()] +
                           "); keep a dynamic dim sharded from the inputs on (or gathered), or export it static");
  }
  Emitter e{program, mesh, before, why, value, nullptr, value};
  try {
    for (const auto& step : plan.steps) e.run(step);
    if (e.current != value) e.lay_out_as(global);
  } catch (const c10::Error& err) {
    throw DTensorError("graph: " + why + ": moving %" + value->name + " [" + c10::Join(", ", global.shape) + "] from " +
                       to_string(from) + " to " + to_string(to) + " failed: " + err.what_without_backtrace());
  }
  if (e.current == value) return value;  // nothing to do on this rank (a partition it keeps whole)
  program.annotations.set_placements(*e.current, to);
  return e.current;
}

}  // namespace dtensor::graph::detail
