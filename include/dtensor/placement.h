#pragma once
// Placement: how a DTensor's data is laid out along one mesh dimension.
// Shard(dim): the tensor is chunked along `dim` (torch.chunk semantics for uneven sizes).
// Replicate: every rank along the mesh dim holds the whole (sub)tensor.
// Partial(op): every rank holds a contribution; the value is the reduction `op` of them.
// StridedShard(dim, split_factor): the dim is `split_factor` equal blocks and every rank holds its
// torch.chunk piece of each block, the pieces back to back. A view produces it when it merges a sharded
// dim into the dims before it ([8,12] S(1) viewed as [96] is StridedShard(0, 8)), so that the merge and
// the split back need no communication (PyTorch's _StridedShard). The dim it shards is sharded by no
// other mesh dim.
// HeadTailShard(dim): the dim is 2n equal chunks over the n ranks of the mesh dim and rank r holds
// chunks r and 2n-1-r, back to back: context parallelism's load-balanced sequence, where causal
// attention costs every rank alike. A placement rather than an order of the data (PyTorch reorders the
// buffers), so that full_tensor and redistribution put the sequence back in order. The dim's length
// must be a multiple of 2n, and it is sharded by no other mesh dim.
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
  enum class Kind : std::uint8_t { Shard, Replicate, Partial, StridedShard, HeadTailShard };

  static Placement shard(int64_t dim) { return Placement(Kind::Shard, dim, ReduceOp::Sum); }
  static Placement replicate() { return Placement(Kind::Replicate, 0, ReduceOp::Sum); }
  static Placement partial(ReduceOp op = ReduceOp::Sum) { return Placement(Kind::Partial, 0, op); }
  // Throws unless split_factor >= 1 (1 is plain Shard(dim), and is returned as that).
  static Placement strided_shard(int64_t dim, int64_t split_factor);
  static Placement head_tail_shard(int64_t dim) { return Placement(Kind::HeadTailShard, dim, ReduceOp::Sum, 2); }

  Kind kind() const { return kind_; }
  // Plain Shard only: a StridedShard or HeadTailShard is not one torch.chunk piece, so code written for
  // Shard must not take it for one. is_sharding() covers all three.
  bool is_shard() const { return kind_ == Kind::Shard; }
  bool is_shard(int64_t dim) const { return kind_ == Kind::Shard && dim_ == dim; }
  bool is_strided_shard() const { return kind_ == Kind::StridedShard; }
  bool is_head_tail_shard() const { return kind_ == Kind::HeadTailShard; }
  // Whether the rank's shard is several runs of the dim (StridedShard, HeadTailShard) rather than one.
  bool is_multi_run_shard() const { return kind_ == Kind::StridedShard || kind_ == Kind::HeadTailShard; }
  bool is_sharding() const { return kind_ == Kind::Shard || is_multi_run_shard(); }
  bool is_replicate() const { return kind_ == Kind::Replicate; }
  bool is_partial() const { return kind_ == Kind::Partial; }
  // Shard dimension; only meaningful for the shardings (is_sharding).
  int64_t dim() const { return dim_; }
  // The same sharding of another dim.
  Placement with_dim(int64_t dim) const { return Placement(kind_, dim, op_, split_factor_); }
  // Blocks of a StridedShard's dim, and a HeadTailShard's 2 halves; 1 for every other placement.
  int64_t split_factor() const { return split_factor_; }
  // Reduce op; only meaningful for Partial.
  ReduceOp reduce_op() const { return op_; }

  // Shard with a negative dim normalised against a tensor of `ndim` dimensions; throws when out of range.
  Placement normalized(int64_t ndim) const;

  bool operator==(const Placement& o) const {
    return kind_ == o.kind_ && (!is_sharding() || dim_ == o.dim_) && split_factor_ == o.split_factor_ &&
           (kind_ != Kind::Partial || op_ == o.op_);
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
  size_t hash() const;
  // Short form: S(0), R, P(sum), SS(0,8) (StridedShard(0, 8)), HT(1) (HeadTailShard(1)).
  std::string str() const;

 private:
  Placement(Kind k, int64_t dim, ReduceOp op, int64_t split_factor = 1)
      : kind_(k), op_(op), dim_(dim), split_factor_(split_factor) {}
  Kind kind_;
  ReduceOp op_;
  int64_t dim_;
  int64_t split_factor_;
};

using Placements = std::vector<Placement>;

inline Placement Shard(int64_t dim) { return Placement::shard(dim); }
inline Placement Replicate() { return Placement::replicate(); }
inline Placement Partial(ReduceOp op = ReduceOp::Sum) { return Placement::partial(op); }
inline Placement StridedShard(int64_t dim, int64_t split_factor) { return Placement::strided_shard(dim, split_factor); }
inline Placement HeadTailShard(int64_t dim) { return Placement::head_tail_shard(dim); }

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
