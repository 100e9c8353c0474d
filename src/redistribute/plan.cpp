#include "dtensor/redistribute_plan.h"

#include <cstdio>

namespace dtensor {

std::string to_string(StepKind kind) {
  switch (kind) {
    case StepKind::AllGather: return "all-gather";
    case StepKind::AllToAll: return "all-to-all";
    case StepKind::AllReduce: return "all-reduce";
    case StepKind::ReduceScatter: return "reduce-scatter";
    case StepKind::LocalChunk: return "local chunk";
    case StepKind::LocalPartition: return "local partition";
    case StepKind::LocalPad: return "local pad";
  }
  return "?";
}

bool is_collective(StepKind kind) {
  return kind != StepKind::LocalChunk && kind != StepKind::LocalPartition && kind != StepKind::LocalPad;
}

std::string format_bytes(double bytes) {
  char buf[32];
  if (bytes < 1e3) std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else if (bytes < 1e6) std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  else if (bytes < 1e9) std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  return buf;
}

std::string RedistributeStep::str() const {
  std::string s = to_string(kind) + " on dim " + std::to_string(mesh_dim);
  if (is_collective(kind)) s += " (" + format_bytes(static_cast<double>(bytes_per_rank)) + "/rank)";
  return s;
}

std::vector<int64_t> RedistributeStep::pad_to_whole(int64_t ndim, int64_t group_size, int64_t index) const {
  const int64_t d = from.dim(), length = logical_shape[d];
  const ChunkExtent c = chunk_extent(length, group_size, index);
  std::vector<int64_t> pad(2 * (ndim - d), 0);
  pad[pad.size() - 2] = c.offset;
  pad[pad.size() - 1] = length - c.offset - c.size;
  return pad;
}

int64_t RedistributePlan::total_bytes_per_rank() const {
  int64_t total = 0;
  for (const auto& s : steps) total += s.bytes_per_rank;
  return total;
}

bool RedistributePlan::needs_communication() const {
  for (const auto& s : steps)
    if (is_collective(s.kind)) return true;
  return false;
}

std::string RedistributePlan::str() const {
  std::string s = to_string(src) + " -> " + to_string(dst) + ": ";
  if (steps.empty()) return s + "nothing to do";
  for (size_t i = 0; i < steps.size(); ++i) s += (i ? ", then " : "") + steps[i].str();
  return s;
}

namespace {

// Builds the plan while tracking the current placements, so every step's logical shape reflects the
// state at the moment it runs.
class Planner {
 public:
  Planner(const Shape& global_shape, int64_t element_size, const Shape& mesh_shape, const Shape& coordinate,
          const Placements& src)
      : global_(global_shape), element_size_(element_size), mesh_(mesh_shape), coord_(coordinate), state_(src) {}

  const Placements& state() const { return state_; }

  // Moves mesh dim m from its current placement to `to`, as one or two steps.
  void transition(int64_t m, const Placement& to) {
    const Placement from = state_[m];
    if (from == to) return;
    // A strided or head-tail shard is gathered to Replicate and cut from it: every other move goes
    // through Replicate.
    if (from.is_multi_run_shard() || (to.is_multi_run_shard() && !from.is_replicate())) {
      if (to.is_replicate()) return add(m, to, StepKind::AllGather);
      transition(m, Placement::replicate());
      return transition(m, to);
    }
    if (to.is_multi_run_shard()) return add(m, to, StepKind::LocalChunk);
    if (from.is_shard() && to.is_shard()) return add(m, to, StepKind::AllToAll);
    if (from.is_shard() && to.is_replicate()) return add(m, to, StepKind::AllGather);
    if (from.is_replicate() && to.is_shard()) return add(m, to, StepKind::LocalChunk);
    if (from.is_replicate() && to.is_partial()) return add(m, to, StepKind::LocalPartition);
    if (from.is_partial() && to.is_replicate()) return add(m, to, StepKind::AllReduce);
    if (from.is_partial() && to.is_shard()) return add(m, to, StepKind::ReduceScatter);
    // A sum of the shards each padded with zeros to the whole is the whole: the gradient of a value
    // read sharded where its producer needs it whole (a replicated projection's output read by
    // sharded heads) goes back Partial, joining a reduction the graph runs anyway.
    if (from.is_shard() && to.is_partial() && to.reduce_op() == ReduceOp::Sum) return add(m, to, StepKind::LocalPad);
    // Other Shard -> Partial and Partial(a) -> Partial(b) have no direct collective: go through Replicate.
    transition(m, Placement::replicate());
    transition(m, to);
  }

  std::vector<RedistributeStep> take_steps() { return std::move(steps_); }

 private:
  // What this mesh dim's group holds together now: the global shape cut by every other mesh dim's
  // current shard, with this dim's own shard undone.
  Shape logical_shape(int64_t m) const {
    Placements others = state_;
    others[m] = Placement::replicate();
    return local_shape(global_, mesh_, coord_, others);
  }

  int64_t bytes(int64_t m, StepKind kind, const Shape& logical, const Placement& to) const {
    const int64_t n = mesh_[m];
    const Placement& from = state_[m];
    // Every chunk is padded to the largest (of each block, for a strided shard).
    auto padded_bytes = [&](const Placement& sharding) {
      Shape s = logical;
      const int64_t blocks = sharding.split_factor();
      s[sharding.dim()] = blocks * padded_chunk_size(s[sharding.dim()] / blocks, n) * n;
      return numel(s) * element_size_;
    };
    switch (kind) {
      case StepKind::AllGather: return padded_bytes(from) * (n - 1) / n;
      case StepKind::ReduceScatter: return padded_bytes(to) * (n - 1) / n;
      case StepKind::AllReduce: return 2 * numel(logical) * element_size_ * (n - 1) / n;
      case StepKind::AllToAll: {
        Shape local = logical;
        local[from.dim()] = chunk_extent(logical[from.dim()], n, coord_[m]).size;
        return numel(local) * element_size_ * (n - 1) / n;
      }
      case StepKind::LocalChunk:
      case StepKind::LocalPartition:
      case StepKind::LocalPad: return 0;
    }
    return 0;
  }

  void add(int64_t m, const Placement& to, StepKind kind) {
    Shape logical = logical_shape(m);
    const int64_t b = bytes(m, kind, logical, to);
    steps_.push_back(RedistributeStep{m, state_[m], to, kind, std::move(logical), b});
    state_[m] = to;
  }

  const Shape& global_;
  int64_t element_size_;
  const Shape& mesh_;
  const Shape& coord_;
  Placements state_;
  std::vector<RedistributeStep> steps_;
};

bool shards(const Placement& p, int64_t d) { return p.is_sharding() && p.dim() == d; }

// Tensor dim `d` is sharded alike by the outer mesh dims (< m) in both placement lists.
bool same_outer_sharding(const Placements& a, const Placements& b, int64_t m, int64_t d) {
  for (int64_t i = 0; i < m; ++i)
    if (shards(a[i], d) != shards(b[i], d) || (shards(a[i], d) && a[i] != b[i])) return false;
  return true;
}

}  // namespace

RedistributePlan plan_redistribute(const Shape& global_shape, int64_t element_size, const Shape& mesh_shape,
                                   const Shape& coordinate, const Placements& src, const Placements& dst) {
  Planner planner(global_shape, element_size, mesh_shape, coordinate, src);
  const auto ndim = static_cast<int64_t>(src.size());
  // Pass 1, innermost mesh dim first: a shard nested inside outer mesh dims is only valid while the
  // outer sharding of its tensor dim stays as it is. Where the target shards a tensor dim whose outer
  // sharding differs between now and the target, replicate first; pass 2 shards it again once the
  // outer dims are final. Inner dims are settled before outer ones touch the data, so a collective on
  // an outer dim never sees a tensor dim that an inner dim still shards differently.
  for (int64_t m = ndim - 1; m >= 0; --m) {
    Placement target = dst[m];
    if (target.is_sharding() && !same_outer_sharding(planner.state(), dst, m, target.dim())) target = Placement::replicate();
    planner.transition(m, target);
  }
  // Pass 2, outermost first: whatever pass 1 left replicated is now chunked (or partitioned) locally.
  for (int64_t m = 0; m < ndim; ++m) planner.transition(m, dst[m]);
  return RedistributePlan{src, dst, planner.take_steps()};
}

}  // namespace dtensor
