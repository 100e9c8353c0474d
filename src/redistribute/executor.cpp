#include "executor.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_map>

#include "../mesh/collectives.h"
#include "dtensor/errors.h"
#include "redistribute_log.h"

namespace dtensor::detail {

at::Tensor padded_rows(const at::Tensor& x, int64_t rows) {
  if (x.size(0) == rows && x.is_contiguous()) return x;
  auto sizes = x.sizes().vec();
  sizes[0] = rows;
  at::Tensor buffer = at::empty(sizes, x.options());
  buffer.narrow(0, 0, x.size(0)).copy_(x);
  return buffer;
}

at::Tensor partition_replicated(const at::Tensor& local, const DeviceMesh& mesh, int64_t mesh_dim, ReduceOp op,
                                Direction direction) {
  const int64_t n = mesh.size(mesh_dim);
  if (direction == Direction::Backward) {
    // d(reduce_r x_r)/dx_r: 1 for sum, 1/n for avg; max/min would need the forward values.
    if (op == ReduceOp::Sum) return local;
    if (op == ReduceOp::Avg) return local / n;
    throw DTensorError("cannot backpropagate into a Partial(" + to_string(op) + ") DTensor: the gradient of a " +
                       to_string(op) + " reduction depends on which rank held the extreme value; reduce it "
                       "(redistribute to Replicate) before the differentiable computation");
  }
  // For sum the first rank keeps the value and the others contribute zero; avg, max and min of equal
  // copies are the copy.
  if (op == ReduceOp::Sum && (*mesh.coordinate())[mesh_dim] != 0) return at::zeros_like(local);
  return local;
}

namespace {

// `t` with dim d seen as [blocks, d's length / blocks]: a StridedShard's blocks along dim d, their
// elements along d + 1.
at::Tensor in_blocks(const at::Tensor& t, int64_t d, int64_t blocks) {
  std::vector<int64_t> split = t.sizes().vec();
  split[d] = t.size(d) / blocks;
  split.insert(split.begin() + d, blocks);
  return t.reshape(split);
}

// The runs of a HeadTailShard along `mesh_dim` that the rank at `rank` holds of a dim of `length`.
std::vector<SequenceRun> head_tail_runs(int64_t length, const DeviceMesh& mesh, int64_t mesh_dim, int64_t rank) {
  return sequence_runs(length, mesh.size(mesh_dim), rank, true, "HeadTailShard over " + mesh.dim_label(mesh_dim));
}

}  // namespace

at::Tensor strided_chunk(const at::Tensor& whole, const Placement& strided, const DeviceMesh& mesh, int64_t mesh_dim) {
  const int64_t d = strided.dim(), blocks = strided.split_factor();
  if (strided.is_head_tail_shard()) {
    std::vector<at::Tensor> runs;
    for (const SequenceRun& run : head_tail_runs(whole.size(d), mesh, mesh_dim, (*mesh.coordinate())[mesh_dim]))
      runs.push_back(whole.narrow(d, run.global_offset, run.size));
    return at::cat(runs, d);
  }
  const ChunkExtent c = strided_block_chunk(whole.size(d), blocks, mesh.size(mesh_dim), (*mesh.coordinate())[mesh_dim]);
  return in_blocks(whole, d, blocks).narrow(d + 1, c.offset, c.size).flatten(d, d + 1).contiguous();
}

namespace {

// SS(d,k) -> R: every rank holds its chunk of each of the k blocks. Each chunk is padded to the largest,
// the ranks' [k, chunk] pieces gathered as [n, k, chunk], and the blocks put back together as [k, n*chunk]
// cut to the block's length.
at::Tensor strided_all_gather_step(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  const int64_t d = step.from.dim(), n = mesh.size(step.mesh_dim), blocks = step.from.split_factor();
  const int64_t block = step.logical_shape[d] / blocks, chunk = padded_chunk_size(block, n);
  const at::Tensor mine = in_blocks(local.movedim(d, 0), 0, blocks);
  std::vector<int64_t> padded_shape = mine.sizes().vec();
  padded_shape[1] = chunk;
  at::Tensor padded = at::empty(padded_shape, local.options());
  padded.narrow(1, 0, mine.size(1)).copy_(mine);
  padded_shape.insert(padded_shape.begin(), n);
  at::Tensor gathered = all_gather(mesh, step.mesh_dim, padded.flatten(0, 1)).view(padded_shape);
  at::Tensor whole = gathered.transpose(0, 1).flatten(1, 2).narrow(1, 0, block).flatten(0, 1);
  return whole.movedim(0, d).contiguous();
}

// An all-gather step's input: this rank's rows (the gathered dim leading), padded to the chunk size.
at::Tensor all_gather_input(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  const int64_t d = step.from.dim();
  return padded_rows(local.movedim(d, 0), padded_chunk_size(step.logical_shape[d], mesh.size(step.mesh_dim)));
}

// The gathered rows as the step's result. Chunks are full-size before partial and empty ones, so the
// first rows (the dim's length) are the data.
at::Tensor all_gather_output(const at::Tensor& gathered, const RedistributeStep& step) {
  const int64_t d = step.from.dim();
  const at::Tensor rows = gathered.narrow(0, 0, step.logical_shape[d]);
  return d == 0 ? rows : rows.movedim(0, d).contiguous();
}

// HT(d) -> R: the ranks' blocks (equal: whole chunks) gathered back to back, then put in the sequence's order.
at::Tensor head_tail_all_gather_step(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  const int64_t d = step.from.dim(), length = step.logical_shape[d];
  const std::vector<int64_t> order =
      sequence_order_of_blocks(length, mesh.size(step.mesh_dim), true, "HeadTailShard over " + mesh.dim_label(step.mesh_dim));
  const at::Tensor blocks = all_gather(mesh, step.mesh_dim, local.movedim(d, 0).contiguous());
  return blocks.index_select(0, at::tensor(order, at::kLong)).movedim(0, d).contiguous();
}

at::Tensor all_gather_step(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  if (step.from.is_strided_shard()) return strided_all_gather_step(local, step, mesh);
  if (step.from.is_head_tail_shard()) return head_tail_all_gather_step(local, step, mesh);
  return all_gather_output(all_gather(mesh, step.mesh_dim, all_gather_input(local, step, mesh)), step);
}

// A reduce-scatter step's input: the rows of the scattered dim (leading), padded to n whole chunks.
at::Tensor reduce_scatter_input(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  const int64_t d = step.to.dim();
  return padded_rows(local.movedim(d, 0), padded_chunk_size(local.size(d), mesh.size(step.mesh_dim)) * mesh.size(step.mesh_dim));
}

// This rank's reduced chunk as the step's result; `length` is the scattered dim's length.
at::Tensor reduce_scatter_output(const at::Tensor& mine, const RedistributeStep& step, int64_t length,
                                 const DeviceMesh& mesh) {
  const int64_t d = step.to.dim();
  const int64_t keep = chunk_extent(length, mesh.size(step.mesh_dim), (*mesh.coordinate())[step.mesh_dim]).size;
  const at::Tensor rows = mine.narrow(0, 0, keep);
  return d == 0 ? rows : rows.movedim(0, d).contiguous();
}

at::Tensor reduce_scatter_step(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  const at::Tensor mine =
      reduce_scatter(mesh, step.mesh_dim, reduce_scatter_input(local, step, mesh), step.from.reduce_op());
  return reduce_scatter_output(mine, step, local.size(step.to.dim()), mesh);
}

// True when every dim before `d` has size 1: pieces cut along `d` from a contiguous tensor of this
// shape are then consecutive runs of its memory, in piece order.
bool leads(c10::IntArrayRef sizes, int64_t d) {
  return std::all_of(sizes.begin(), sizes.begin() + d, [](int64_t s) { return s == 1; });
}

// `x` cut into n torch.chunk pieces along `d` (views).
std::vector<at::Tensor> chunks_along(const at::Tensor& x, int64_t d, int64_t n) {
  std::vector<at::Tensor> pieces;
  for (int64_t q = 0; q < n; ++q) {
    const ChunkExtent c = chunk_extent(x.size(d), n, q);
    pieces.push_back(x.narrow(d, c.offset, c.size));
  }
  return pieces;
}

// The contiguous blocks of `flat` (shapes[q] each, back to back) joined along `d`.
at::Tensor join_blocks(const at::Tensor& flat, const std::vector<Shape>& shapes, int64_t d) {
  Shape joined = shapes.front();
  joined[d] = 0;
  for (const Shape& s : shapes) joined[d] += s[d];
  if (leads(joined, d)) return flat.view(joined);  // the blocks in order already are the joined tensor
  std::vector<at::Tensor> blocks;
  int64_t offset = 0;
  for (const Shape& s : shapes) {
    blocks.push_back(flat.narrow(0, offset, numel(s)).view(s));
    offset += numel(s);
  }
  return at::cat(blocks, d);
}

at::Tensor all_to_all_step(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  const int64_t from = step.from.dim(), to = step.to.dim(), n = mesh.size(step.mesh_dim);
  const int64_t me = (*mesh.coordinate())[step.mesh_dim];
  const int64_t from_length = step.logical_shape[from], to_length = local.size(to);
  // Member q gets our chunk q along `to`; from q we get its chunk along `from` of our chunk along `to`,
  // each block laid out in the tensor's own dim order.
  Shape block = local.sizes().vec();
  block[to] = chunk_extent(to_length, n, me).size;
  std::vector<Shape> recv_shapes;
  for (int64_t q = 0; q < n; ++q) {
    block[from] = chunk_extent(from_length, n, q).size;
    recv_shapes.push_back(block);
  }
  const at::Tensor received = all_to_all_pieces(mesh, step.mesh_dim, chunks_along(local, to, n), recv_shapes);
  return join_blocks(received, recv_shapes, from);
}

at::Tensor local_chunk_step(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  if (step.to.is_multi_run_shard()) return strided_chunk(local, step.to, mesh, step.mesh_dim);
  const int64_t d = step.to.dim();
  const ChunkExtent c = chunk_extent(local.size(d), mesh.size(step.mesh_dim), (*mesh.coordinate())[step.mesh_dim]);
  return local.narrow(d, c.offset, c.size).contiguous();
}

// This rank's shard of dim d padded with zeros to the group's whole: its contribution to a Partial sum.
at::Tensor local_pad_step(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  return at::constant_pad_nd(local, step.pad_to_whole(local.dim(), mesh.size(step.mesh_dim), (*mesh.coordinate())[step.mesh_dim]), 0);
}

at::Tensor run_step(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh, Direction direction,
                    Ownership ownership) {
  // Along a mesh dim of one rank every collective is the identity (the one shard is the whole, the
  // one contribution the value): skip the round trip through the process group.
  if (is_collective(step.kind) && mesh.size(step.mesh_dim) == 1) return local;
  switch (step.kind) {
    case StepKind::AllGather: return all_gather_step(local, step, mesh);
    case StepKind::ReduceScatter: return reduce_scatter_step(local, step, mesh);
    case StepKind::AllToAll: return all_to_all_step(local, step, mesh);
    case StepKind::LocalChunk: return local_chunk_step(local, step, mesh);
    case StepKind::LocalPad: return local_pad_step(local, step, mesh);
    case StepKind::LocalPartition:
      return partition_replicated(local, mesh, step.mesh_dim, step.to.reduce_op(), direction);
    case StepKind::AllReduce: {
      // In place when the plan owns `local` and it is laid out as the collective needs; otherwise the
      // caller's tensor stays intact.
      if (ownership == Ownership::Donated && local.is_contiguous()) {
        at::Tensor out = local;
        all_reduce_(mesh, step.mesh_dim, out, step.from.reduce_op());
        return out;
      }
      return all_reduce(mesh, step.mesh_dim, local, step.from.reduce_op());
    }
  }
  return local;
}

struct PlanKey {
  Shape shape;
  int64_t element_size;
  // A plan depends on the mesh only through its shape and this rank's coordinate.
  Shape mesh_shape, coordinate;
  Placements from, to;
  bool operator==(const PlanKey& o) const {
    return element_size == o.element_size && shape == o.shape && mesh_shape == o.mesh_shape &&
           coordinate == o.coordinate && from == o.from && to == o.to;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = static_cast<size_t>(k.element_size);
    for (const Shape* v : {&k.shape, &k.mesh_shape, &k.coordinate})
      for (auto s : *v) h = h * 1000003 ^ static_cast<size_t>(s);
    return h * 31 + hash_placements(k.from) * 7 + hash_placements(k.to);
  }
};

}  // namespace

const RedistributePlan& cached_plan(const DTensorSpec& from, const Placements& to) {
  thread_local std::unordered_map<PlanKey, RedistributePlan, PlanKeyHash> cache;
  const DeviceMesh& mesh = *from.mesh;
  PlanKey key{from.meta.shape, static_cast<int64_t>(c10::elementSize(from.meta.dtype)), mesh.shape(),
              *mesh.coordinate(), from.placements, to};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() > 4096) cache.clear();  // bound memory; entries are cheap to recompute
    auto plan = plan_redistribute(key.shape, key.element_size, key.mesh_shape, key.coordinate, key.from, key.to);
    it = cache.emplace(std::move(key), std::move(plan)).first;
  }
  return it->second;
}

at::Tensor execute_plan(const RedistributePlan& plan, const at::Tensor& local, const DeviceMesh& mesh,
                        Direction direction, Ownership ownership) {
  at::Tensor current = plan.steps.empty() ? local : with_views_resolved(local);
  for (const auto& step : plan.steps) {
    // A step's output in memory of its own (not the caller's) is this plan's to overwrite.
    if (!current.is_alias_of(local)) ownership = Ownership::Donated;
    current = run_step(current, step, mesh, direction, ownership);
  }
  return current;
}

namespace {

// Starts the collective `step` on `current` and returns what waits for it and makes the step's result.
std::function<at::Tensor()> start_collective_step(const at::Tensor& current, const RedistributeStep& step,
                                                  const MeshPtr& mesh) {
  switch (step.kind) {
    case StepKind::AllGather: {
      StartedCollective started = start_all_gather(mesh, step.mesh_dim, all_gather_input(current, step, *mesh));
      return [started, step]() mutable { return all_gather_output(started.wait(), step); };
    }
    case StepKind::ReduceScatter: {
      StartedCollective started =
          start_reduce_scatter(mesh, step.mesh_dim, reduce_scatter_input(current, step, *mesh), step.from.reduce_op());
      return [started, step, mesh, length = current.size(step.to.dim())]() mutable {
        return reduce_scatter_output(started.wait(), step, length, *mesh);
      };
    }
    default: {
      StartedCollective started = start_all_reduce(mesh, step.mesh_dim, current, step.from.reduce_op());
      return [started]() mutable { return started.wait(); };
    }
  }
}

}  // namespace

StartedRedistribution start_redistribute_local(const at::Tensor& local, const DTensorSpec& from, const Placements& to) {
  const DeviceMesh& mesh = *from.mesh;
  const RedistributePlan* plan = mesh.coordinate() ? &cached_plan(from, to) : nullptr;
  // The plan's steps that cross ranks: one of the kinds that start is what runs asynchronously.
  size_t collective = 0, collectives = 0;
  for (size_t i = 0; plan && i < plan->steps.size(); ++i)
    if (is_collective(plan->steps[i].kind) && mesh.size(plan->steps[i].mesh_dim) > 1) {
      collective = i;
      ++collectives;
    }
  const auto startable = [&](const RedistributeStep& s) {
    return (s.kind == StepKind::AllGather && !s.from.is_multi_run_shard()) || s.kind == StepKind::ReduceScatter ||
           s.kind == StepKind::AllReduce;
  };
  if (collectives != 1 || !startable(plan->steps[collective])) return {redistribute_local(local, from, to), {}};
  log_redistribute(from, to);
  at::Tensor current = with_views_resolved(local);
  for (size_t i = 0; i < collective; ++i)
    current = run_step(current, plan->steps[i], mesh, Direction::Forward,
                       current.is_alias_of(local) ? Ownership::Borrowed : Ownership::Donated);
  // Copies: the per-thread plan cache may drop the plan before the result is waited for.
  std::vector<RedistributeStep> rest(plan->steps.begin() + static_cast<std::ptrdiff_t>(collective) + 1, plan->steps.end());
  return {at::Tensor(), [started = start_collective_step(current, plan->steps[collective], from.mesh),
                          rest = std::move(rest), mesh = from.mesh]() {
            at::Tensor result = started();
            for (const RedistributeStep& step : rest)
              result = run_step(result, step, *mesh, Direction::Forward, Ownership::Donated);
            return result;
          }};
}

at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& from, const Placements& to,
                              Direction direction, Ownership ownership) {
  if (!from.mesh->coordinate()) return local;  // ranks outside the mesh hold an empty shard
  log_redistribute(from, to);
  return execute_plan(cached_plan(from, to), local, *from.mesh, direction, ownership);
}

}  // namespace dtensor::detail
