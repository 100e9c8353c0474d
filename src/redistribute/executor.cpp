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

}  // namespace

at::Tensor strided_chunk(const at::Tensor& whole, const Placement& strided, const DeviceMesh& mesh, int64_t mesh_dim) {
  const int64_t d = strided.dim(), blocks = strided.split_factor();
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

at::Tensor all_gather_step(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  if (step.from.is_strided_shard()) return strided_all_gather_step(local, step, mesh);
  const int64_t d = step.from.dim(), n = mesh.size(step.mesh_dim);
  const int64_t length = step.logical_shape[d];
  at::Tensor rows = padded_rows(local.movedim(d, 0), padded_chunk_size(length, n));
  at::Tensor gathered = all_gather(mesh, step.mesh_dim, rows).narrow(0, 0, length);
  // Chunks are full-size before partial and empty ones, so the first `length` rows are the data.
  return d == 0 ? gathered : gathered.movedim(0, d).contiguous();
}

at::Tensor reduce_scatter_step(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh) {
  const int64_t d = step.to.dim(), n = mesh.size(step.mesh_dim);
  const int64_t length = local.size(d);
  at::Tensor rows = padded_rows(local.movedim(d, 0), padded_chunk_size(length, n) * n);
  at::Tensor mine = reduce_scatter(mesh, step.mesh_dim, rows, step.from.reduce_op());
  const int64_t keep = chunk_extent(length, n, (*mesh.coordinate())[step.mesh_dim]).size;
  mine = mine.narrow(0, 0, keep);
  return d == 0 ? mine : mine.movedim(0, d).contiguous();
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
  if (step.to.is_strided_shard()) return strided_chunk(local, step.to, mesh, step.mesh_dim);
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

at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& from, const Placements& to,
                              Direction direction, Ownership ownership) {
  if (!from.mesh->coordinate()) return local;  // ranks outside the mesh hold an empty shard
  log_redistribute(from, to);
  return execute_plan(cached_plan(from, to), local, *from.mesh, direction, ownership);
}

}  // namespace dtensor::detail
