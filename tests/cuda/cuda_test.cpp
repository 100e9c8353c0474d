// DTensors on CUDA: run where a GPU is present, skipped with a visible reason elsewhere (this binary
// links libtorch_cuda so that LibTorch sees the GPU when there is one). Two local ranks share device 0:
//  - DTensors holding CUDA shards on a Gloo mesh (Gloo moves CUDA tensors through host memory);
//  - a one-rank NCCL mesh (CUDA device type), when dtensor was built with -DDTENSOR_WITH_NCCL=ON, also
//    for fully_shard's CPU offload.
// Each result is compared with the same computation on one device.

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <iostream>
#include <string>

#include "dtensor/comm_debug.h"
#include "dtensor/dtensor.h"
#include "dtensor/fsdp.h"
#include "dtensor/module.h"
#include "dtensor/optim.h"

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

// A one-rank NCCL mesh (CUDA device type) on rank 0, or null with `why` it cannot be had here.
dtensor::MeshPtr one_rank_nccl_mesh(std::string& why) {
  if (g_world->rank() != 0) {
    why = "the one-rank NCCL mesh lives on rank 0";
    return nullptr;
  }
  try {
    return dtensor::DeviceMesh::create(g_world, {1}, {0}, {.device_type = c10::DeviceType::CUDA});
  } catch (const dtensor::DTensorError& e) {
    why = e.what();  // built without NCCL: the error says how to build with it
    return nullptr;
  }
}

TEST(Cuda, OneRankNcclMesh) {
  REQUIRE_GPU();
  std::string why;
  const dtensor::MeshPtr mesh = one_rank_nccl_mesh(why);
  if (!mesh) GTEST_SKIP() << why;
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

// Two Linear layers for fully_shard: `a` its own group, the root takes `b`.
class TwoLinearImpl : public torch::nn::Module {
 public:
  TwoLinearImpl() : a(register_module("a", torch::nn::Linear(6, 5))), b(register_module("b", torch::nn::Linear(5, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return dtensor::call(b, at::relu(dtensor::call(a, x))); }
  torch::nn::Linear a, b;
};
TORCH_MODULE(TwoLinear);

// fully_shard with CPUOffloadPolicy on a one-rank NCCL mesh: the shards (and so their gradients and
// AdamW's state) are pinned host tensors while forward and backward run on the GPU; three steps equal
// the same model trained on the GPU alone.
TEST(Cuda, FullyShardCpuOffloadKeepsTheShardsInHostMemory) {
  REQUIRE_GPU();
  std::string why;
  const dtensor::MeshPtr mesh = one_rank_nccl_mesh(why);
  if (!mesh) GTEST_SKIP() << why;
  torch::manual_seed(6);
  TwoLinear reference;
  torch::manual_seed(6);
  TwoLinear parallel;
  reference->to(at::Device(at::kCUDA, 0));
  parallel->to(at::Device(at::kCUDA, 0));
  const dtensor::FullyShardOptions options{.offload_policy = dtensor::CPUOffloadPolicy{.pin_memory = true}};
  dtensor::fully_shard(*parallel->a, mesh, options);
  dtensor::fully_shard(*parallel, mesh, options);
  EXPECT_TRUE(dtensor::offloads_to_cpu(*parallel) && dtensor::offloads_to_cpu(*parallel->a));
  for (const auto& p : parallel->named_parameters()) {
    EXPECT_TRUE(dtensor::local_tensor_of(p.value()).is_cpu()) << p.key();
    EXPECT_TRUE(dtensor::local_tensor_of(p.value()).is_pinned()) << p.key();
  }
  torch::optim::AdamW optimizer(parallel->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW optimizer_ref(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = at::randn({4, 6}, at::TensorOptions().device(at::kCUDA, 0));
    optimizer.zero_grad();
    dtensor::call(parallel, x).square().mean().backward();
    for (const auto& p : parallel->named_parameters())
      EXPECT_TRUE(dtensor::local_tensor_of(p.value().grad()).is_cpu()) << p.key() << " step " << step;
    dtensor::step_on_local_shards(optimizer);
    optimizer_ref.zero_grad();
    reference->forward(x).square().mean().backward();
    optimizer_ref.step();
  }
  const auto expected = reference->named_parameters();
  for (const auto& p : parallel->named_parameters())
    EXPECT_TRUE(at::allclose(dtensor::full_tensor(p.value()).cpu(), expected[p.key()].cpu(), 1e-5, 1e-6)) << p.key();
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
