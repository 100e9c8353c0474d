#include "harness.h"
#include "op_db.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <unistd.h>

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

std::vector<MeshPtr> meshes() { return {mesh({4}), mesh({2, 2})}; }

void DistTest::TearDown() {
  auto store = g_world->store();
  const std::string prefix = "dtensor-test/" + std::to_string(g_test_serial++) + "/";
  std::string mine = HasFailure() ? (g_failures.empty() ? std::string("failed") : g_failures) : "ok";
  // The store refuses messages over 8 MiB, which would leave the other ranks waiting for this one.
  constexpr size_t kReportBytes = 1 << 20;
  if (mine.size() > kReportBytes) mine = mine.substr(0, kReportBytes) + "\n... (report truncated)";
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

std::filesystem::path shared_directory(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("dtensor-test-" + std::to_string(getppid())) / name;
  if (world()->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  world()->sum_across_ranks(0);
  return dir;
}

at::Tensor test_tensor(const Shape& shape, at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(-8, 9, shape, gen, at::TensorOptions().dtype(at::kLong)).to(dtype);
}

namespace {

// Random integer offsets, one tensor per member of a group of n, the same on every rank for the same
// seed (so each member can compute what the others hold).
std::vector<at::Tensor> offsets(const at::Tensor& x, int64_t n, uint64_t seed, int64_t low, int64_t high) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(at::randint(low, high + 1, x.sizes(), gen, at::TensorOptions().dtype(at::kLong)).to(x.scalar_type()));
  return out;
}

// Member i's contribution of n to `x`, drawn at random, such that reducing all of them with `op`
// gives x exactly (for integer-valued data): a sum splits into random parts, an average into x plus
// offsets that cancel (integers: offsets whose sum is a remainder the truncating average drops, so a
// rule that wrongly treats an integer average as linear shows), a max/min puts x on one member and
// values below/above it on the others.
at::Tensor contribution(const at::Tensor& x, ReduceOp op, int64_t i, int64_t n, uint64_t seed) {
  const auto r = offsets(x, n, seed, -4, 4);
  const int64_t holder = static_cast<int64_t>(seed % static_cast<uint64_t>(n));  // who holds x itself
  switch (op) {
    case ReduceOp::Sum: {
      if (i != holder) return r[i];
      at::Tensor rest = at::zeros_like(x);
      for (int64_t j = 0; j < n; ++j)
        if (j != holder) rest += r[j];
      return x - rest;
    }
    case ReduceOp::Avg: {
      at::Tensor total = at::isIntegralType(x.scalar_type(), false) ? x.sign() * (static_cast<int64_t>(seed % 3) % n)
                                                                   : at::zeros_like(x);
      if (i != holder) return x + r[i];
      for (int64_t j = 0; j < n; ++j)
        if (j != holder) total = total - r[j];
      return x + total;
    }
    case ReduceOp::Max: return i == holder ? x : x - r[i].abs();
    case ReduceOp::Min: return i == holder ? x : x + r[i].abs();
  }
  return x;
}

}  // namespace

at::Tensor make_dtensor_holding(const at::Tensor& full, const MeshPtr& mesh, const Placements& placements, uint64_t seed) {
  at::Tensor local = full;
  if (mesh->coordinate()) {
    const Shape& coord = *mesh->coordinate();
    for (int64_t m = 0; m < mesh->ndim(); ++m) {
      const Placement p = placements[m].normalized(full.dim());
      if (p.is_shard()) {
        const ChunkExtent c = chunk_extent(local.size(p.dim()), mesh->size(m), coord[m]);
        local = local.narrow(p.dim(), c.offset, c.size);
      } else if (p.is_strided_shard()) {
        local = strided_piece(local, p.dim(), p.split_factor(), mesh->size(m), coord[m]);
      } else if (p.is_partial()) {
        local = contribution(local, p.reduce_op(), coord[m], mesh->size(m), seed * 7919 + static_cast<uint64_t>(m));
      }
    }
  }
  FromLocalOptions options;
  options.run_check = false;
  options.shape = full.sizes().vec();
  options.stride = full.strides().vec();
  // A copy: the DTensor must not share `full`'s memory (an in-place op would change the caller's oracle).
  return from_local(local.clone(at::MemoryFormat::Contiguous), mesh, placements, options);
}

at::Tensor expected_shard(const at::Tensor& full, const MeshPtr& mesh, const Placements& placements) {
  // From torch.chunk alone, mesh dim by mesh dim (a dim sharded twice is chunked in mesh-dim order).
  at::Tensor out = full;
  const Shape coordinate = *mesh->coordinate();
  for (size_t m = 0; m < placements.size(); ++m) {
    const Placement p = placements[m].normalized(full.dim());
    if (!p.is_sharding()) continue;
    const int64_t ranks = mesh->size(static_cast<int64_t>(m));
    out = strided_piece(out, p.dim(), p.split_factor(), ranks, coordinate[m]);
  }
  return out;
}

namespace {
thread_local std::string g_counted_op;
thread_local int64_t g_op_calls = 0;

std::unique_ptr<at::ObserverContext> count_op(const at::RecordFunction& fn) {
  if (std::string_view(fn.name()) == g_counted_op) ++g_op_calls;
  return nullptr;
}
}  // namespace

OpCounter::OpCounter(std::string op_name)
    : handle_(at::addThreadLocalCallback(at::RecordFunctionCallback(count_op).needsInputs(false))) {
  g_counted_op = std::move(op_name);
  g_op_calls = 0;
}
OpCounter::~OpCounter() { at::removeCallback(handle_); }
int64_t OpCounter::count() const { return g_op_calls; }

}  // namespace dtensor::testing

int main(int argc, char** argv) {
  dtensor::LaunchOptions options;
  if (const char* n = std::getenv("DTENSOR_TEST_RANKS")) options.nprocs = std::atoi(n);
  options.grace = std::chrono::seconds(20);
  // A failed test can leave peers in a collective: let it time out quickly (unless asked otherwise).
  setenv("DTENSOR_TIMEOUT_S", "30", /*overwrite=*/0);
  return dtensor::run_local_ranks(argc, argv, options, [&](const std::shared_ptr<dtensor::World>& world) {
    dtensor::testing::g_world = world;
    // The ranks share the machine's cores: one intra-op thread each (more oversubscribe, and idle
    // OpenMP threads spin).
    at::set_num_threads(1);
    ::testing::InitGoogleTest(&argc, argv);
    dtensor::testing::register_op_db_tests();
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (world->rank() != 0) delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new dtensor::testing::FailureCollector);
    return RUN_ALL_TESTS();
  });
}
