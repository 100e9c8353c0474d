// DTensors on CUDA: run where a GPU is present, skipped with a visible reason elsewhere (this binary
// links libtorch_cuda so that LibTorch sees the GPU when there is one). Two local ranks share device 0:
//  - DTensors holding CUDA shards on a Gloo mesh (Gloo moves CUDA tensors through host memory);
//  - a one-rank NCCL mesh (CUDA device type), when dtensor was built with -DDTENSOR_WITH_NCCL=ON.
// Each result is compared with the same computation on one device.

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "dtensor/comm_debug.h"
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

// The fused attention kernels CUDA dispatch picks (flash, memory-efficient, cuDNN; the math path as
// a control), forward and backward, with heads sharded over the mesh: each against the same backend
// on one device. A backend that cannot run this configuration on one device is skipped by name.
struct SdpBackend {
  const char* name;
  at::ScalarType dtype;
  void (*select)();
  const char* kernel;  // the op the DTensors must reach (its rule), or nullptr for the math composite
};

void only(bool flash, bool efficient, bool cudnn, bool math) {
  auto& ctx = at::globalContext();
  ctx.setSDPUseFlash(flash);
  ctx.setSDPUseMemEfficient(efficient);
  ctx.setSDPUseCuDNN(cudnn);
  ctx.setSDPUseMath(math);
}

const SdpBackend kSdpBackends[] = {
    {"flash", at::kBFloat16, [] { only(true, false, false, false); }, "aten::_scaled_dot_product_flash_attention"},
    {"efficient", at::kFloat, [] { only(false, true, false, false); }, "aten::_scaled_dot_product_efficient_attention"},
    {"cudnn", at::kBFloat16, [] { only(false, false, true, false); }, "aten::_scaled_dot_product_cudnn_attention"},
    {"math", at::kFloat, [] { only(false, false, false, true); }, nullptr},
};

TEST(Cuda, FusedAttentionShardsHeads) {
  REQUIRE_GPU();
  auto mesh = dtensor::DeviceMesh::create(g_world, {g_world->size()});
  for (const SdpBackend& backend : kSdpBackends) {
    SCOPED_TRACE(backend.name);
    backend.select();
    at::manual_seed(3);
    const auto options = at::TensorOptions().dtype(backend.dtype).device(at::kCUDA, 0);
    // [batch 2, heads 4, length 24, head_dim 64]: every kernel's constraints hold
    const at::Tensor q = at::randn({2, 4, 24, 64}, options), k = at::randn({2, 4, 24, 64}, options);
    const at::Tensor v = at::randn({2, 4, 24, 64}, options), grad = at::randn({2, 4, 24, 64}, options);
    std::vector<at::Tensor> leaves = {q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_()};
    at::Tensor expected;
    try {
      expected = at::scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], {}, 0.0, /*is_causal=*/true);
    } catch (const c10::Error& e) {
      if (g_world->rank() == 0) std::cout << "[ skipped ] " << backend.name << " on one device: " << e.what_without_backtrace() << "\n";
      continue;
    }
    expected.backward(grad);
    std::vector<at::Tensor> dleaves;
    for (const at::Tensor& t : {q, k, v})
      dleaves.push_back(dtensor::distribute_tensor(t, mesh, dtensor::Placements{dtensor::Shard(1)}).requires_grad_());
    at::Tensor out;
    {
      dtensor::CommDebugMode debug;
      out = at::scaled_dot_product_attention(dleaves[0], dleaves[1], dleaves[2], {}, 0.0, /*is_causal=*/true);
      const auto ops = debug.ops();
      if (backend.kernel) EXPECT_NE(std::find(ops.begin(), ops.end(), backend.kernel), ops.end()) << debug.summary();
      EXPECT_EQ(debug.collectives().size(), 0u) << "heads sharded alike need no communication: " << debug.summary();
    }
    EXPECT_EQ(dtensor::placements_of(out), dtensor::Placements{dtensor::Shard(1)});
    out.backward(dtensor::distribute_tensor(grad, mesh, dtensor::Placements{dtensor::Shard(1)}));
    const double tol = backend.dtype == at::kBFloat16 ? 2e-2 : 1e-5;
    EXPECT_TRUE(at::allclose(dtensor::full_tensor(out).to(at::kFloat), expected.to(at::kFloat), tol, tol));
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(at::allclose(dtensor::full_tensor(dleaves[i].grad()).to(at::kFloat), leaves[i].grad().to(at::kFloat), tol, tol)) << "grad " << i;
  }
  only(true, true, true, true);
}

// rms_norm on CUDA runs the fused kernel (_fused_rms_norm): rows sharded unevenly (5 over the ranks).
TEST(Cuda, FusedRmsNormShardsRows) {
  REQUIRE_GPU();
  auto mesh = dtensor::DeviceMesh::create(g_world, {g_world->size()});
  at::manual_seed(4);
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0);
  const at::Tensor x = at::randn({5, 3, 16}, options), w = at::randn({16}, options), grad = at::randn({5, 3, 16}, options);
  at::Tensor lx = x.clone().requires_grad_(), lw = w.clone().requires_grad_();
  at::Tensor expected = at::rms_norm(lx, {16}, lw, 1e-6);
  expected.backward(grad);
  at::Tensor dx = dtensor::distribute_tensor(x, mesh, dtensor::Placements{dtensor::Shard(0)}).requires_grad_();
  at::Tensor dw = dtensor::distribute_tensor(w, mesh, dtensor::Placements{dtensor::Replicate()}).requires_grad_();
  at::Tensor out;
  {
    dtensor::CommDebugMode debug;
    out = at::rms_norm(dx, {16}, dw, 1e-6);
    if (g_world->rank() == 0) std::cout << "rms_norm on CUDA DTensors ran: " << c10::Join(", ", debug.ops()) << "\n";
  }
  EXPECT_EQ(dtensor::placements_of(out), dtensor::Placements{dtensor::Shard(0)});
  out.backward(dtensor::distribute_tensor(grad, mesh, dtensor::Placements{dtensor::Shard(0)}));
  EXPECT_TRUE(at::allclose(dtensor::full_tensor(out), expected, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(dtensor::full_tensor(dx.grad()), lx.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(dtensor::full_tensor(dw.grad()), lw.grad(), 1e-4, 1e-4));
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
