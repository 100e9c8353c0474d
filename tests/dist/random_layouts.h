#pragma once
// Layouts the random-op tests draw on: the 1-d mesh of 4 and the 2x2 mesh, uneven shards and Partial
// included.

#include "harness.h"

namespace dtensor::testing {

inline std::vector<std::pair<MeshPtr, Placements>> layouts_2d() {
  auto m1 = mesh({4}), m2 = mesh({2, 2});
  return {{m1, {Replicate()}},          {m1, {Shard(0)}},           {m1, {Shard(1)}},
          {m1, {Partial()}},            {m2, {Shard(0), Shard(1)}}, {m2, {Shard(1), Shard(0)}},
          {m2, {Shard(0), Shard(0)}},   {m2, {Replicate(), Shard(1)}}, {m2, {Partial(), Shard(0)}},
          {m2, {Partial(ReduceOp::Max), Replicate()}}};
}

inline std::string describe(const MeshPtr& m, const Placements& p) { return m->str() + " (" + to_string(p) + ")"; }

inline bool has_partial(const Placements& p) {
  return std::any_of(p.begin(), p.end(), [](const Placement& x) { return x.is_partial(); });
}

}  // namespace dtensor::testing
