#include "dtensor/placement.h"

#include <sstream>

#include "dtensor/errors.h"

namespace dtensor {

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

Placement Placement::strided_shard(int64_t dim, int64_t split_factor) {
  if (split_factor < 1)
    throw DTensorError("StridedShard(" + std::to_string(dim) + ", " + std::to_string(split_factor) +
                       "): the split factor counts blocks of the dim and must be at least 1");
  if (split_factor == 1) return shard(dim);
  return Placement(Kind::StridedShard, dim, ReduceOp::Sum, split_factor);
}

Placement Placement::normalized(int64_t ndim) const {
  if (!is_sharding()) return *this;
  const int64_t d = dim_ < 0 ? dim_ + ndim : dim_;
  if (d < 0 || d >= ndim) {
    const std::string name = is_shard()          ? "Shard(" + std::to_string(dim_) + ")"
                             : is_head_tail_shard() ? "HeadTailShard(" + std::to_string(dim_) + ")"
                                                    : "StridedShard(" + std::to_string(dim_) + ", " + std::to_string(split_factor_) + ")";
    throw DTensorError(name + " is out of range for a tensor with " + std::to_string(ndim) +
                       " dimension(s); pick a dim in [" + std::to_string(-ndim) + ", " + std::to_string(ndim) + ")");
  }
  return Placement(kind_, d, op_, split_factor_);
}

size_t Placement::hash() const {
  size_t h = static_cast<size_t>(kind_);
  if (is_sharding()) h = (h * 31 + static_cast<size_t>(dim_)) * 31 + static_cast<size_t>(split_factor_);
  if (is_partial()) h = h * 31 + static_cast<size_t>(op_);
  return h;
}

std::string Placement::str() const {
  switch (kind_) {
    case Kind::Shard: return "S(" + std::to_string(dim_) + ")";
    case Kind::Replicate: return "R";
    case Kind::Partial: return "P(" + to_string(op_) + ")";
    case Kind::StridedShard: return "SS(" + std::to_string(dim_) + "," + std::to_string(split_factor_) + ")";
    case Kind::HeadTailShard: return "HT(" + std::to_string(dim_) + ")";
  }
  return "?";
}

Placements partial_as_replicate(Placements placements) {
  for (auto& p : placements)
    if (p.is_partial()) p = Replicate();
  return placements;
}

std::string to_string(const Placements& placements) {
  std::string out;
  for (size_t i = 0; i < placements.size(); ++i) out += (i ? "," : "") + placements[i].str();
  return out;
}

size_t hash_placements(const Placements& placements) {
  size_t h = placements.size();
  for (const auto& p : placements) h = h * 1000003 ^ p.hash();
  return h;
}

std::ostream& operator<<(std::ostream& os, const Placement& p) { return os << p.str(); }
std::ostream& operator<<(std::ostream& os, const Placements& p) { return os << to_string(p); }

}  // namespace dtensor
