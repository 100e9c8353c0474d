#pragma once
// Multi-rank test harness. The test binary starts itself as N local ranks (real processes, real c10d
// process groups: through mpirun on dtensor's MPI backend when dtensor has MPI, or forked onto Gloo
// with DTENSOR_BACKEND=gloo); every rank runs the same GoogleTest sequence. At the end of each test the
// ranks exchange their outcomes through the job's store, so a failure on any rank fails the test on
// all of them with that rank's message, and a rank that does not finish in time fails it by timeout.
// Only rank 0 prints.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../strided_piece.h"
#include "../support/error_of.h"
#include "../support/tensor_assertions.h"
#include "dtensor/dtensor.h"

namespace dtensor::testing {

std::shared_ptr<World> world();

// A mesh over the given world ranks (default: the first numel(shape) ranks), created once and cached
// (every rank asks for the same meshes in the same order, as the tests run in the same order).
MeshPtr mesh(const Shape& shape, std::vector<int64_t> ranks = {}, std::vector<std::string> names = {});

// The 1-d mesh of 4 and the 2x2 one (unnamed): what a test that must hold on both runs over.
std::vector<MeshPtr> meshes();

class DistTest : public ::testing::Test {
 protected:
  void TearDown() override;
};

// An empty directory every rank names alike (the ranks share their launcher as parent), made anew by
// rank 0 before every rank returns.
std::filesystem::path shared_directory(const std::string& name);

// A deterministic integer-valued tensor, the same on every rank for the same seed, so sums and
// averages in any order are exact in every dtype tested (bfloat16 included).
at::Tensor test_tensor(const Shape& shape, at::ScalarType dtype, uint64_t seed);

// A DTensor on `mesh` with `placements` whose value is exactly `full`: shards cut with torch.chunk
// (of every block, for a StridedShard),
// Partial values split into random integer contributions (drawn from `seed`, the same on every rank)
// that reduce back to `full` exactly when it is integer-valued.
at::Tensor make_dtensor_holding(const at::Tensor& full, const MeshPtr& mesh, const Placements& placements,
                                uint64_t seed = 0);

// This rank's expected shard of `full` for non-Partial placements.
at::Tensor expected_shard(const at::Tensor& full, const MeshPtr& mesh, const Placements& placements);

// Counts the calls of one ATen operator (e.g. "aten::_local_scalar_dense", item()'s host sync, each a
// stall on CUDA) that this thread makes while the counter is alive.
class OpCounter {
 public:
  explicit OpCounter(std::string op_name);
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  int64_t count() const;

 private:
  uint64_t handle_;
};

}  // namespace dtensor::testing
