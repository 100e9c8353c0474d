#pragma once
// Placement: how a DTensor's data is laid out along one mesh dimension.
// Shard(dim): the tensor is chunked along `dim` (torch.chunk semantics for uneven sizes).
// Replicate: every rank along the mesh dim holds the whole (sub)tensor.
// Partial(op): every rank holds a contribution; the value is the reduction `op` of them.
// Pure value type: no torch headers, so layout and planning code stay cheap to compile.

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace dtensor {

enum class ReduceOp { Sum, Avg, Max, Min };
std::string to_string(ReduceOp op);

class Placement {
 public:
  enum class Kind : std::uint8_t { Shard, Replicate, Partial };

  static Placement shard(int64_t dim) { return Placement(Kind::Shard, dim, ReduceOp::Sum); }
  static Placement replicate() { return Placement(Kind::Replicate, 0, ReduceOp::Sum); }
  static Placement partial(ReduceOp op = ReduceOp::Sum) { return Placement(Kind::Partial, 0, op); }

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::Shard; }
  bool is_shard(int64_t dim) const { return kind_ == Kind::Shard && dim_ == dim; }
  bool is_replicate() const { return kind_ == Kind::Replicate; }
  bool is_partial() const { return kind_ == Kind::Partial; }
  // Shard dimension; only meaningful for Shard.
  int64_t dim() const { return dim_; }
  // Reduce op; only meaningful for Partial.
  ReduceOp reduce_op() const { return op_; }

  // Shard with a negative dim normalised against a tensor of `ndim` dimensions; throws when out of range.
  Placement normalized(int64_t ndim) const;

  bool operator==(const Placement& o) const {
    return kind_ == o.kind_ && (kind_ != Kind::Shard || dim_ == o.dim_) && (kind_ != Kind::Partial || op_ == o.op_);
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
  size_t hash() const;
  // Short form: S(0), R, P(sum).
  std::string str() const;

 private:
  Placement(Kind k, int64_t dim, ReduceOp op) : kind_(k), op_(op), dim_(dim) {}
  Kind kind_;
  ReduceOp op_;
  int64_t dim_;
};

using Placements = std::vector<Placement>;

inline Placement Shard(int64_t dim) { return Placement::shard(dim); }
inline Placement Replicate() { return Placement::replicate(); }
inline Placement Partial(ReduceOp op = ReduceOp::Sum) { return Placement::partial(op); }

// "S(0),R" — the form plans and errors print.
std::string to_string(const Placements& placements);
// The same placements with every Partial replaced by Replicate: the layout of the reduced value.
Placements partial_as_replicate(Placements placements);
size_t hash_placements(const Placements& placements);
std::ostream& operator<<(std::ostream& os, const Placement& p);
std::ostream& operator<<(std::ostream& os, const Placements& p);

}  // namespace dtensor

template <>
struct std::hash<dtensor::Placement> {
  size_t operator()(const dtensor::Placement& p) const { return p.hash(); }
};
