// DTensors on CUDA: run where a GPU is present, skipped with a visible reason elsewhere (this binary
// links libtorch_cuda so that LibTorch sees the GPU when there is one). Two local ranks share device 0:
//  - DTensors holding CUDA shards on a Gloo mesh (Gloo moves CUDA tensors through host memory);
//  - a one-rank NCCL mesh (CUDA device type), when dtensor was built with -DDTENSOR_WITH_NCCL=ON.
// Each result is compared with the same computation on one device.

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "dtensor/dtensor.h"

namespace {

std::shared_ptr<dtensor::World> g_world;

bool have_gpu() { return at::hasCUDA() && at::getNumGPUs() > 0; }

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device on this machine: CUDA tests skipped"

at::Tensor on_gpu(const at::Tensor& t) { return t.to(at::Device(at::kCUDA, 0)); }

TEST(Cuda, DTensorsWithCudaShardsOnAGlooMesh) {
  REQUIRE_GPU();
  auto mesh = dtensor::DeviceMesh::create(g_world, {g_world->size()});
  at::manual_seed(1);  // the same tensors on both ranks
  const at::Tensor x = at::randn({6, 5}, at::kDouble);
  const at::Tensor w = at::randn({5, 7}, at::kDouble);
  at::Tensor dx = dtensor::distribute_tensor(on_gpu(x), mesh, dtensor::Placements{dtensor::Shard(0)});
  at::Tensor dw = dtensor::distribute_tensor(on_gpu(w), mesh, dtensor::Placements{dtensor::Shard(1)});
  EXPECT_TRUE(dtensor::local_tensor_of(dx).is_cuda());
  at::Tensor y = at::relu(at::mm(dx, dw)) * 2;
  EXPECT_TRUE(at::allclose(dtensor::full_tensor(y).cpu(), at::relu(at::mm(x, w)) * 2));
  at::Tensor moved = dtensor::redistribute(y, {dtensor::Shard(1)});
  EXPECT_TRUE(at::allclose(dtensor::full_tensor(moved).cpu(), at::relu(at::mm(x, w)) * 2));
}

TEST(Cuda, OneRankNcclMesh) {
  REQUIRE_GPU();
  if (g_world->rank() != 0) GTEST_SKIP() << "the one-rank NCCL mesh lives on rank 0";
  dtensor::MeshPtr mesh;
  try {
    mesh = dtensor::DeviceMesh::create(g_world, {1}, {0}, {.device_type = c10::DeviceType::CUDA});
  } catch (const dtensor::DTensorError& e) {
    GTEST_SKIP() << e.what();  // built without NCCL: the error says how to build with it
  }
  at::manual_seed(2);
  const at::Tensor x = at::randn({4, 3}, at::kFloat);
  at::Tensor dx = dtensor::distribute_tensor(on_gpu(x), mesh, dtensor::Placements{dtensor::Shard(0)});
  at::Tensor s = dtensor::full_tensor((dx * 3).sum(0));
  EXPECT_TRUE(at::allclose(s.cpu(), (x * 3).sum(0)));
}

}  // namespace

int main(int argc, char** argv) {
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 2}, [&](const std::shared_ptr<dtensor::World>& world) {
    g_world = world;
    ::testing::InitGoogleTest(&argc, argv);
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (world->rank() != 0) delete listeners.Release(listeners.default_result_printer());
    const int rc = RUN_ALL_TESTS();
    return world->sum_across_ranks(rc) == 0 ? 0 : 1;
  });
}
