#include "harness.h"
#include "op_db.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>

namespace dtensor::testing {
namespace {

std::shared_ptr<World> g_world;
int g_test_serial = 0;
std::string g_failures;  // this rank's failure messages in the current test

std::chrono::milliseconds exchange_timeout() {
  const char* v = std::getenv("DTENSOR_TEST_RANK_TIMEOUT_S");
  return std::chrono::milliseconds(static_cast<int64_t>((v ? std::stod(v) : 180.0) * 1000));
}

class FailureCollector : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override { g_failures.clear(); }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::ostringstream s;
    s << (r.file_name() ? r.file_name() : "?") << ":" << r.line_number() << ": " << r.summary() << "\n";
    g_failures += s.str();
  }
};

}  // namespace

std::shared_ptr<World> world() { return g_world; }

MeshPtr mesh(const Shape& shape, std::vector<int64_t> ranks, std::vector<std::string> names) {
  static std::map<std::tuple<Shape, std::vector<int64_t>, std::vector<std::string>>, MeshPtr> cache;
  if (ranks.empty())
    for (int64_t r = 0; r < numel(shape); ++r) ranks.push_back(r);
  auto key = std::make_tuple(shape, ranks, names);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  MeshOptions options;
  options.dim_names = names;
  return cache[key] = DeviceMesh::create(g_world, shape, ranks, options);
}

void DistTest::TearDown() {
  auto store = g_world->store();
  const std::string prefix = "dtensor-test/" + std::to_string(g_test_serial++) + "/";
  const std::string mine = HasFailure() ? (g_failures.empty() ? std::string("failed") : g_failures) : "ok";
  store->set(prefix + std::to_string(g_world->rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
  for (int r = 0; r < g_world->size(); ++r) {
    if (r == g_world->rank()) continue;
    const std::string key = prefix + std::to_string(r);
    try {
      store->wait({key}, exchange_timeout());
    } catch (const std::exception&) {
      ADD_FAILURE() << "rank " << r << " did not finish this test within " << exchange_timeout().count() / 1000
                    << " s (hung or crashed)";
      continue;
    }
    const auto bytes = store->get(key);
    const std::string outcome(bytes.begin(), bytes.end());
    if (outcome != "ok") ADD_FAILURE() << "rank " << r << " failed:\n" << outcome;
  }
}

at::Tensor test_tensor(const Shape& shape, at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(-8, 9, shape, gen, at::TensorOptions().dtype(at::kLong)).to(dtype);
}

namespace {

// Contributions of `x` for member i of n such that reducing them with `op` gives x exactly.
at::Tensor contribution(const at::Tensor& x, ReduceOp op, int64_t i, int64_t n) {
  switch (op) {
    case ReduceOp::Sum: {
      // member 0 holds x minus what the others hold (2, 3, ... n)
      const int64_t others = n * (n + 1) / 2 - 1;
      return i == 0 ? x - others : at::full_like(x, i + 1);
    }
    case ReduceOp::Avg: return x + (2 * i - (n - 1));  // offsets sum to zero
    case ReduceOp::Max: return x - i;
    case ReduceOp::Min: return x + i;
  }
  return x;
}

}  // namespace

at::Tensor make_dtensor_holding(const at::Tensor& full, const MeshPtr& mesh, const Placements& placements) {
  at::Tensor local = full;
  if (mesh->coordinate()) {
    const Shape& coord = *mesh->coordinate();
    for (int64_t m = 0; m < mesh->ndim(); ++m) {
      const Placement p = placements[m].normalized(full.dim());
      if (p.is_shard()) {
        const ChunkExtent c = chunk_extent(local.size(p.dim()), mesh->size(m), coord[m]);
        local = local.narrow(p.dim(), c.offset, c.size);
      } else if (p.is_partial()) {
        local = contribution(local, p.reduce_op(), coord[m], mesh->size(m));
      }
    }
  }
  FromLocalOptions options;
  options.run_check = false;
  options.shape = full.sizes().vec();
  options.stride = full.strides().vec();
  return from_local(local.contiguous(), mesh, placements, options);
}

at::Tensor expected_shard(const at::Tensor& full, const MeshPtr& mesh, const Placements& placements) {
  Placements normalized;
  for (const auto& p : placements) normalized.push_back(p.normalized(full.dim()));
  const LocalLayout l = local_layout(full.sizes().vec(), mesh->shape(), *mesh->coordinate(), normalized);
  at::Tensor out = full;
  for (int64_t d = 0; d < full.dim(); ++d) out = out.narrow(d, l.offset[d], l.shape[d]);
  return out;
}

::testing::AssertionResult tensors_equal(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != expected " << expected.sizes();
  if (actual.scalar_type() != expected.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << actual.scalar_type() << " != expected " << expected.scalar_type();
  if (!at::equal(actual, expected))
    return ::testing::AssertionFailure() << "values differ:\nactual\n" << actual << "\nexpected\n" << expected;
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult tensors_close(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != expected " << expected.sizes();
  if (!at::allclose(actual, expected, rtol, atol))
    return ::testing::AssertionFailure() << "values differ (max abs diff "
                                         << (actual - expected).abs().max().item<double>() << ")";
  return ::testing::AssertionSuccess();
}

}  // namespace dtensor::testing

int main(int argc, char** argv) {
  dtensor::LaunchOptions options;
  if (const char* n = std::getenv("DTENSOR_TEST_RANKS")) options.nprocs = std::atoi(n);
  options.grace = std::chrono::seconds(20);
  // A failed test can leave peers in a collective: let it time out quickly (unless asked otherwise).
  setenv("DTENSOR_TIMEOUT_S", "30", /*overwrite=*/0);
  return dtensor::run_local_ranks(argc, argv, options, [&](const std::shared_ptr<dtensor::World>& world) {
    dtensor::testing::g_world = world;
    ::testing::InitGoogleTest(&argc, argv);
    dtensor::testing::register_op_db_tests();
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (world->rank() != 0) delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new dtensor::testing::FailureCollector);
    return RUN_ALL_TESTS();
  });
}
