// Every placement transition on 1-d meshes of 1-4 ranks and a 2x2 mesh, with even, uneven, zero-size
// and 0-d tensors in four dtypes, against the full tensor on one device.

#include "../../src/redistribute/executor.h"
#include <random>

#include "harness.h"

namespace dtensor::testing {
namespace {

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kLong};

// Every kind of placement on one mesh dim. On 2-d meshes (squared: every pair of pairs) Partial
// avg/min and negative dims, which take the same code paths as sum/max and positive dims, are left out.
std::vector<Placement> one_dim_placements(int64_t tensor_ndim, bool every_variant) {
  std::vector<Placement> out = {Replicate(), Partial(ReduceOp::Sum), Partial(ReduceOp::Max)};
  if (every_variant) {
    out.push_back(Partial(ReduceOp::Avg));
    out.push_back(Partial(ReduceOp::Min));
    if (tensor_ndim > 0) out.push_back(Shard(-1));  // normalised against the tensor's rank
  }
  for (int64_t d = 0; d < tensor_ndim; ++d) out.push_back(Shard(d));
  return out;
}

std::vector<Placements> all_placements(int64_t mesh_ndim, int64_t tensor_ndim) {
  std::vector<Placements> out = {{}};
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    std::vector<Placements> next;
    for (const auto& prefix : out)
      for (const auto& p : one_dim_placements(tensor_ndim, mesh_ndim == 1)) {
        Placements ps = prefix;
        ps.push_back(p);
        next.push_back(ps);
      }
    out = next;
  }
  // Drop mixes of Partial ops whose value would depend on reduction order (refused by design).
  std::vector<Placements> valid;
  for (auto& ps : out) {
    try {
      validate_placements(ps, mesh_ndim, tensor_ndim, "test");
      valid.push_back(ps);
    } catch (const DTensorError&) {
    }
  }
  return valid;
}

bool has_partial(const Placements& ps) {
  for (const auto& p : ps)
    if (p.is_partial()) return true;
  return false;
}

// Moves a DTensor holding `full` from src to dst and checks the shard and the whole against `full`.
::testing::AssertionResult check_transition(const at::Tensor& full, const MeshPtr& mesh, const Placements& src,
                                            const Placements& dst) {
  at::Tensor source = make_dtensor_holding(full, mesh, src);
  at::Tensor moved;
  if (has_partial(dst)) {
    // Partial targets are internal (ops produce them); the executor runs them.
    const DTensorSpec& spec = spec_of(source);
    const Placements target = validate_placements(dst, mesh->ndim(), full.dim(), "test");
    moved = make_dtensor(detail::redistribute_local(local_tensor_of(source), spec, target), spec.with_placements(target));
  } else {
    moved = redistribute(source, dst);
    auto shard = tensors_equal(to_local(moved), expected_shard(full, mesh, dst));
    if (!shard) return shard << " (local shard)";
  }
  return tensors_equal(full_tensor(moved), full);
}

struct Case {
  Shape shape;
  std::vector<at::ScalarType> dtypes;
};

void run_all_transitions(const MeshPtr& mesh, const std::vector<Case>& cases) {
  if (!mesh->contains_this_rank()) return;
  int failures = 0, checked = 0;
  uint64_t seed = 1;
  for (const auto& [shape, dtypes] : cases) {
    const auto placements = all_placements(mesh->ndim(), static_cast<int64_t>(shape.size()));
    for (auto dtype : dtypes) {
      const at::Tensor full = test_tensor(shape, dtype, seed++);
      for (const auto& src : placements) {
        for (const auto& dst : placements) {
          auto result = check_transition(full, mesh, src, dst);
          ++checked;
          if (!result && failures++ < 5)
            ADD_FAILURE() << mesh->str() << " shape " << shape_str(shape) << " " << dtype << ": " << to_string(src)
                          << " -> " << to_string(dst) << ": " << result.message();
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
  if (world()->rank() == 0) std::cerr << "checked " << checked << " transitions\n";
}

// Uneven (5 over 2, 3, 4), even, zero-size and 0-d shapes, each in every dtype.
const std::vector<Case> kOneDimCases = {{{5, 3}, kDtypes}, {{8, 4}, kDtypes}, {{0, 3}, kDtypes}, {{}, kDtypes}};

class RedistributeTest : public DistTest {};

TEST_F(RedistributeTest, TransitionsOneRank) { run_all_transitions(mesh({1}, {0}), kOneDimCases); }
TEST_F(RedistributeTest, TransitionsTwoRanks) { run_all_transitions(mesh({2}, {0, 1}), kOneDimCases); }
TEST_F(RedistributeTest, TransitionsThreeRanks) { run_all_transitions(mesh({3}, {0, 1, 2}), kOneDimCases); }
TEST_F(RedistributeTest, TransitionsFourRanks) { run_all_transitions(mesh({4}), kOneDimCases); }
// 2x2: every dtype on the uneven shape (5 rows over 2x2 nests as 3 = 2+1 and 2 = 1+1), two dtypes on
// the even, zero-size and 0-d ones.
TEST_F(RedistributeTest, TransitionsTwoByTwo) {
  run_all_transitions(mesh({2, 2}), {{{5, 3}, kDtypes},
                                     {{4, 6}, {at::kFloat, at::kLong}},
                                     {{3, 0}, {at::kFloat, at::kLong}},
                                     {{}, {at::kFloat, at::kLong}}});
}

}  // namespace
}  // namespace dtensor::testing

namespace dtensor::testing {
namespace {

// Random shapes (uneven, zero-size, 0-d), meshes from 1-d to 3-d (some over a subset of ranks) and
// random placement pairs, including a tensor dim sharded over several mesh dims. Every rank draws the
// same sequence from the same seed.
TEST_F(RedistributeTest, RandomRedistributionsMatchTheFullTensor) {
  std::mt19937 rng(20261122);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  const std::vector<MeshPtr> meshes = {mesh({4}),       mesh({2, 2}),    mesh({1, 4}),         mesh({4, 1}),
                                       mesh({2, 1, 2}), mesh({1, 2, 2}), mesh({3}, {0, 1, 2}), mesh({2}, {1, 3})};
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kLong};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
  auto random_placements = [&](int64_t mesh_ndim, int64_t tensor_ndim, bool allow_partial) {
    for (;;) {
      Placements ps;
      for (int64_t m = 0; m < mesh_ndim; ++m) {
        const int64_t kind = pick(allow_partial ? 3 : 2);
        if (kind == 0 && tensor_ndim > 0) ps.push_back(Shard(pick(tensor_ndim)));
        else if (kind == 2) ps.push_back(Partial(ops[pick(4)]));
        else ps.push_back(Replicate());
      }
      try {
        return validate_placements(ps, mesh_ndim, tensor_ndim, "test");
      } catch (const DTensorError&) {  // a non-commuting Partial mix: draw again
      }
    }
  };
  int failures = 0;
  for (int i = 0; i < 400; ++i) {
    const MeshPtr& m = meshes[pick(static_cast<int64_t>(meshes.size()))];
    Shape shape(pick(4));
    for (auto& s : shape) s = pick(8);
    const at::ScalarType dtype = dtypes[pick(4)];
    const Placements src = random_placements(m->ndim(), static_cast<int64_t>(shape.size()), true);
    const Placements dst = random_placements(m->ndim(), static_cast<int64_t>(shape.size()), pick(4) == 0);
    const at::Tensor full = test_tensor(shape, dtype, static_cast<uint64_t>(i));
    if (!m->contains_this_rank()) continue;
    auto result = check_transition(full, m, src, dst);
    if (!result && failures++ < 5)
      ADD_FAILURE() << "case " << i << ": " << m->str() << " shape " << shape_str(shape) << " " << dtype << ": "
                    << to_string(src) << " -> " << to_string(dst) << ": " << result.message();
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace dtensor::testing
