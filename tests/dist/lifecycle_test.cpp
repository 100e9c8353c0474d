// Lifetimes and threads: meshes release their process groups when they go or are shut down, dtensor's
// caches keep no mesh alive, a world shuts down every group made through it, the propagation cache is
// cleared on every thread and never serves a decision of a replaced rule, and two threads racing on
// one mesh's collectives get a clear error instead of mismatched collectives.

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/library.h>

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "dtensor/shard_module.h"
#include "dtensor/sharding.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;

int64_t entries_in(const char* dir) {
  int64_t n = 0;
  if (DIR* d = opendir(dir)) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}
int64_t open_fds() { return entries_in("/proc/self/fd"); }
int64_t threads() { return entries_in("/proc/self/task"); }

// Builds a mesh, runs a sharded op and a collective on it, and drops everything.
void use_and_drop_a_mesh(const Shape& shape) {
  MeshPtr m = DeviceMesh::create(world(), shape);
  const at::Tensor x = test_tensor({6, 4}, at::kFloat, 3);
  at::Tensor y = distribute_tensor(x, m, Placements(m->ndim(), Shard(0))) * 2;
  ASSERT_TRUE(tensors_equal(full_tensor(y), x * 2));
}

class LifecycleTest : public DistTest {};

TEST_F(LifecycleTest, TwoHundredMeshesComeAndGoWithoutLeakingFdsOrThreads) {
  for (int i = 0; i < 3; ++i) use_and_drop_a_mesh({4});  // warm up (lazy one-time resources)
  const int64_t fds = open_fds(), tasks = threads();
  for (int i = 0; i < 200; ++i) use_and_drop_a_mesh(i % 2 ? Shape{4} : Shape{2, 2});
  EXPECT_EQ(open_fds(), fds);
  EXPECT_EQ(threads(), tasks);
}

TEST_F(LifecycleTest, CachesKeepNoMeshAlive) {
  std::weak_ptr<const DeviceMesh> watched;
  {
    MeshPtr m = DeviceMesh::create(world(), {4});
    watched = m;
    at::Tensor y = at::relu(distribute_tensor(test_tensor({5, 3}, at::kDouble, 4), m, Placements{Shard(0)}).sum(0));
    full_tensor(y);  // propagation and plan caches now hold decisions for this mesh
  }
  EXPECT_TRUE(watched.expired()) << "something still holds the mesh";

  // shard_module's meshes over a subset of ranks go with the last tensor sharded on them.
  std::weak_ptr<const DeviceMesh> sharded_on;
  {
    at::Tensor t = shard_tensor(test_tensor({6, 2}, at::kDouble, 5), ChunkShardingSpec{0, {3, 1}}, 0, mesh({4}));
    sharded_on = mesh_of(t);
  }
  EXPECT_TRUE(sharded_on.expired()) << "shard_module's mesh map keeps its mesh alive";
}

TEST_F(LifecycleTest, ShutDownMeshRefusesCollectivesClearly) {
  MeshPtr m = DeviceMesh::create(world(), {2, 2}, {.dim_names = {"dp", "tp"}});
  MeshPtr tp = (*m)["tp"];
  at::Tensor x = distribute_tensor(test_tensor({4, 4}, at::kFloat, 6), m, Placements{Shard(0), Shard(1)});
  m->shutdown();
  EXPECT_THAT(error_of([&] { full_tensor(x); }), HasSubstr("process groups were shut down"));
  EXPECT_THAT(error_of([&] { distribute_tensor(at::ones({2}), tp, Placements{Shard(0)}); }),
              HasSubstr("process groups were shut down"));
}

TEST_F(LifecycleTest, WorldShutdownReleasesEveryGroupMadeThroughIt) {
  // A second world over the job's store (its own key space), so the harness's world stays up.
  auto store = c10::make_intrusive<c10d::PrefixStore>("second-world", world()->store());
  auto second = std::make_shared<World>(store, world()->rank(), world()->size());
  MeshPtr m = DeviceMesh::create(second, {4});
  at::Tensor x = distribute_tensor(test_tensor({4}, at::kFloat, 7), m, Placements{Shard(0)});
  EXPECT_TRUE(tensors_equal(full_tensor(x), test_tensor({4}, at::kFloat, 7)));
  second->shutdown();
  EXPECT_THAT(error_of([&] { full_tensor(x); }), HasSubstr("process groups were shut down"));
  EXPECT_THAT(error_of([&] { DeviceMesh::create(second, {4}); }), HasSubstr("the world was shut down"));
}

TEST_F(LifecycleTest, ClearingThePropagationCacheReachesEveryThread) {
  at::Tensor x = distribute_tensor(test_tensor({5, 3}, at::kDouble, 8), mesh({4}), Placements{Shard(0)});
  at::Tensor warm = x * 3;  // cached on this thread
  std::thread([] { clear_propagation_cache(); }).join();
  const auto before = propagation_cache_stats();
  at::Tensor again = x * 3;
  EXPECT_EQ(propagation_cache_stats().misses, before.misses + 1);
}

TORCH_LIBRARY(dtensor_lifecycle_test, m) { m.def("scale(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(dtensor_lifecycle_test, CPU, m) {
  m.impl("scale", [](const at::Tensor& x) { return x * 2; });
}

TEST_F(LifecycleTest, ReplacingARuleInvalidatesCachedDecisions) {
  auto scale = c10::Dispatcher::singleton().findSchemaOrThrow("dtensor_lifecycle_test::scale", "").typed<at::Tensor(const at::Tensor&)>();
  const at::Tensor x = test_tensor({8, 3}, at::kDouble, 9);
  at::Tensor dt = distribute_tensor(x, mesh({4}), Placements{Shard(0)});
  register_dim_rule("dtensor_lifecycle_test::scale", [](const OpSchema&) {
    return std::vector<DimStrategy>{{{Replicate()}, {Replicate()}}};
  });
  EXPECT_EQ(placements_of(scale.call(dt)), (Placements{Replicate()}));
  register_dim_rule("dtensor_lifecycle_test::scale", [](const OpSchema&) {
    return std::vector<DimStrategy>{{{Replicate()}, {Replicate()}}, {{Shard(0)}, {Shard(0)}}};
  });
  at::Tensor y = scale.call(dt);
  EXPECT_EQ(placements_of(y), (Placements{Shard(0)})) << "a decision of the replaced rule was served";
  EXPECT_TRUE(tensors_equal(full_tensor(y), x * 2));
}

TEST_F(LifecycleTest, RuleReplacedWhileAnotherThreadDispatches) {
  // Re-registration used to overwrite the rule a dispatching thread was reading.
  auto scale = c10::Dispatcher::singleton().findSchemaOrThrow("dtensor_lifecycle_test::scale", "").typed<at::Tensor(const at::Tensor&)>();
  MeshPtr alone = DeviceMesh::create(world(), {1}, {world()->rank()});  // no collectives: local only
  at::Tensor dt = distribute_tensor(test_tensor({4, 3}, at::kDouble, 10), alone, Placements{Shard(0)});
  const auto rule = [](const OpSchema&) {
    return std::vector<DimStrategy>{{{Replicate()}, {Replicate()}}, {{Shard(0)}, {Shard(0)}}};
  };
  register_dim_rule("dtensor_lifecycle_test::scale", rule);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> registrations{0};
  std::thread writer([&] {
    while (!stop) {
      register_dim_rule("dtensor_lifecycle_test::scale", rule);
      ++registrations;
    }
  });
  std::string failure;
  // At least 300 calls, and on until the writer has replaced the rule a few times: on a loaded machine
  // its thread may get no core during the first 300 (a bounded wait, so a writer that never runs fails
  // the check below instead of hanging).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int i = 0; failure.empty() && (i < 300 || (registrations.load() < 3 && std::chrono::steady_clock::now() < deadline));
       ++i) {
    clear_propagation_cache();  // every call decides anew, reading the rule
    try {
      if (!tensors_equal(to_local(scale.call(dt)), to_local(dt) * 2)) failure = "wrong values";
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  stop = true;
  writer.join();
  EXPECT_EQ(failure, "");
  EXPECT_GT(registrations.load(), 0);
}

TEST_F(LifecycleTest, TwoThreadsRacingOnOneMeshGetAClearError) {
  // Rank 0's first thread sits inside an all-reduce (the other ranks join it only once rank 0's second
  // thread is done); its second thread then starts a collective on the same group and must be refused,
  // not interleaved.
  MeshPtr m = mesh({4});
  at::Tensor partial = make_dtensor_holding(at::ones({3}, at::kFloat), m, {Partial()}, 1);
  const std::string second_done = "lifecycle_test/racing-second-thread-done";
  std::string second_error;
  if (world()->rank() == 0) {
    std::atomic<bool> started = false;
    std::thread first([&] {
      started = true;
      full_tensor(partial);
    });
    while (!started) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // from `started` into the all-reduce
    at::Tensor other = make_dtensor_holding(at::ones({3}, at::kFloat), m, {Partial()}, 2);
    second_error = error_of([&] { full_tensor(other); });
    world()->store()->set(second_done, std::vector<uint8_t>{1});
    first.join();
  } else {
    world()->store()->wait({second_done}, std::chrono::seconds(60));
    full_tensor(partial);
  }
  if (world()->rank() == 0) EXPECT_THAT(second_error, HasSubstr("another thread of this rank is running a collective"));
}

}  // namespace
}  // namespace dtensor::testing
