// distribute_module, torch::optim on DTensor parameters, clipping by the global norm, and the errors
// of module parallelization.

#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "dtensor/comm_debug.h"
#include "dtensor/optim.h"
#include "dtensor/parallel.h"
#include "harness.h"
#include "test_modules.h"

namespace dtensor::testing {
namespace {

class ModuleTest : public DistTest {};

TEST_F(ModuleTest, DistributeModuleReplicatesWhatPartitionLeavesAndRunsInputAndOutputFns) {
  auto m = mesh({4});
  auto reference = seeded<TwoLayer>(6, 10);
  for (bool with_partition : {false, true}) {
    auto model = seeded<TwoLayer>(6, 10);
    PartitionFn partition;
    if (with_partition)
      partition = [](const std::string& name, torch::nn::Module& module, const MeshPtr& mesh) {
        if (name == "up") distribute_parameter(module, "weight", mesh, {Shard(0)}, "up.weight");
      };
    std::vector<std::string> seen;
    auto distributed = distribute_module(
        model, m, partition,
        [&](torch::nn::Module&, std::vector<at::Tensor>& inputs, const MeshPtr& mesh) {
          seen.push_back("input");
          inputs[0] = distribute_tensor(inputs[0], mesh);
        },
        [&](torch::nn::Module&, at::Tensor output, const MeshPtr&) {
          seen.push_back("output");
          return full_tensor(output);
        });
    EXPECT_EQ(placements_of(model->up->weight), (Placements{with_partition ? Shard(0) : Replicate()}));
    EXPECT_EQ(placements_of(model->up->bias), (Placements{Replicate()}));
    EXPECT_EQ(placements_of(model->down->weight), (Placements{Replicate()}));
    const at::Tensor x = test_tensor({5, 6}, at::kDouble, 1);
    const at::Tensor y = distributed(x);
    EXPECT_EQ(seen, (std::vector<std::string>{"input", "output"}));
    EXPECT_FALSE(is_dtensor(y));
    EXPECT_TRUE(tensors_close(y, reference(x), 1e-10, 1e-12));
  }
}

TEST_F(ModuleTest, DistributeModuleWithoutFunctionsReplicatesParametersAndBuffers) {
  auto m = mesh({2, 2});
  torch::nn::BatchNorm1d norm(3);
  distribute_module(*norm, m);
  EXPECT_EQ(placements_of(norm->weight), (Placements{Replicate(), Replicate()}));
  EXPECT_EQ(placements_of(norm->running_mean), (Placements{Replicate(), Replicate()}));
  EXPECT_EQ(placements_of(norm->named_buffers()["running_var"]), (Placements{Replicate(), Replicate()}));
  EXPECT_TRUE(norm->weight.requires_grad());
  EXPECT_TRUE(norm->weight.is_leaf());
}

// torch::optim's SGD (momentum, weight decay), Adam and AdamW step DTensor parameters in place, keep
// their placements, and follow the single-device optimizer step for step.
TEST_F(ModuleTest, TorchOptimizersStepDTensorParametersLikeOneDevice) {
  auto m = mesh({4});
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;
  const std::vector<std::pair<std::string, Make>> optimizers = {
      {"SGD", [](auto p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01)); }},
      {"Adam", [](auto p) { return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01).weight_decay(0.01)); }},
      {"AdamW", [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01)); }},
  };
  for (const auto& [name, make] : optimizers) {
    auto reference = seeded<TwoLayer>(6, 10), parallel = seeded<TwoLayer>(6, 10);
    parallelize_module(*parallel, m, {{"up", ColwiseParallel{}}, {"down", RowwiseParallel{}}});
    auto optimizer = make(parallel->parameters());
    auto optimizer_ref = make(reference->parameters());
    const at::Tensor weight_handle = parallel->up->weight;  // the optimizer must update it in place
    for (int64_t step = 0; step < 3; ++step) {
      const at::Tensor x = test_tensor({5, 6}, at::kDouble, 10 + step) / 4;
      optimizer->zero_grad();
      optimizer_ref->zero_grad();
      EXPECT_FALSE(parallel->up->weight.grad().defined() && parallel->up->weight.grad().abs().sum().item<double>() != 0);
      call(parallel, x).pow(2).sum().backward();
      call(reference, x).pow(2).sum().backward();
      optimizer->step();
      optimizer_ref->step();
    }
    at::NoGradGuard no_grad;
    EXPECT_TRUE(weight_handle.is_same(parallel->up->weight)) << name;
    const auto expected = reference->named_parameters();
    for (const auto& p : parallel->named_parameters()) {
      EXPECT_EQ(placements_of(p.value()), placements_of(p.value().grad())) << name << " " << p.key();
      EXPECT_TRUE(tensors_close(full_tensor(p.value()), expected[p.key()], 1e-10, 1e-12)) << name << " " << p.key();
    }
  }
}

// The global norm over a mix of sharded, replicated (2-d: dp x tp) and plain gradients equals
// LibTorch's clip_grad_norm_ on the whole gradients, clipping included, with one all-reduce per kind
// of sharding rather than one per parameter.
TEST_F(ModuleTest, ClipGradNormUsesTheGlobalNormAcrossShards) {
  auto m = mesh({2, 2}, {}, {"dp", "tp"});
  for (double norm_type : {2.0, 1.0, std::numeric_limits<double>::infinity()}) {
    auto reference = seeded<TwoLayer>(6, 10), parallel = seeded<TwoLayer>(6, 10);
    parallelize_module(*parallel, m, {{"up", ColwiseParallel{}}, {"down", RowwiseParallel{}}}, {.tp_dim = "tp"});
    const at::Tensor x = test_tensor({4, 6}, at::kDouble, 3);
    call(parallel, x).pow(2).sum().backward();  // each dp rank the same batch: gradients 2x the reference's
    call(reference, x).pow(2).sum().mul(2).backward();
    const double expected = torch::nn::utils::clip_grad_norm_(reference->parameters(), 1.0, norm_type);
    CommDebugMode debug;
    OpCounter syncs("aten::_local_scalar_dense");
    const double norm = clip_grad_norm_(parallel->parameters(), 1.0, norm_type);
    EXPECT_EQ(syncs.count(), 1) << "one host sync per clip, not one per parameter";
    EXPECT_NEAR(norm, expected, 1e-9 * expected) << norm_type;
    EXPECT_LE(debug.total_count(), 2) << debug.summary();  // tp-sharded and replicated: one each at most
    expect_grads_equal(*parallel, *reference);
  }
}

TEST_F(ModuleTest, ModuleParallelizationErrorsSayWhatToDo) {
  auto m = mesh({4});
  auto model = seeded<TwoLayer>(6, 10);
  EXPECT_THAT(error_of([&] { parallelize_module(*model, m, {{"layers.*", ColwiseParallel{}}}); }),
              ::testing::HasSubstr("plan entry 'layers.*' matches no submodule of dtensor::testing::TwoLayerImpl (its submodules: up, down)"));
  // An optional entry (a transformers plan's) that matches nothing is skipped; the others apply.
  parallelize_module(*model, m, {{"layers.*", ColwiseParallel{}, /*optional=*/true}, {"up", ColwiseParallel{}}});
  EXPECT_TRUE(is_dtensor(model->up->weight));
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({6}));
  EXPECT_THAT(error_of([&] { parallelize_module(*norm, m, {{"", ColwiseParallel{}}}); }),
              ::testing::HasSubstr("ColwiseParallel supports torch::nn::Linear, Conv1d/2d/3d, BatchNorm1d/2d/3d, "
                                   "Embedding and EmbeddingBag; '' is a torch::nn::LayerNorm"));
  EXPECT_THAT(error_of([&] { parallelize_module(*model, mesh({2, 2}), {{"up", ColwiseParallel{}}}); }),
              ::testing::HasSubstr("name the tensor-parallel mesh dim (ParallelizeOptions::tp_dim)"));
  EXPECT_THAT(error_of([&] {
                parallelize_module(*model, m, {{"", PrepareModuleInput{{Replicate(), Replicate()}, {Replicate()}}}});
              }),
              ::testing::HasSubstr("input_layouts has 2 entries but desired_input_layouts has 1"));
  // A handle kept from before would go on training the unsharded weight.
  const at::Tensor kept = model->down->weight;
  EXPECT_THAT(error_of([&] { parallelize_module(*model, m, {{"down", RowwiseParallel{}}}); }),
              ::testing::HasSubstr("down.weight: the old parameter is still referenced outside the module's registry"));
}

TEST_F(ModuleTest, CallRunsHooksAroundForwardAndMatchesSubmodulesByWildcard) {
  auto model = seeded<TwoLayer>(6, 10);
  const auto matches = match_submodules(*model, "*");
  ASSERT_EQ(matches.size(), 2u);
  EXPECT_EQ(matches[0].first, "up");
  EXPECT_EQ(matches[1].first, "down");
  EXPECT_EQ(match_submodules(*model, "d?wn").size(), 1u);
  EXPECT_EQ(match_submodules(*model, "").at(0).second, model.get());
  register_forward_pre_hook(*model->up, [](torch::nn::Module&, std::vector<at::Tensor>& inputs) { inputs[0] = inputs[0] * 2; });
  register_forward_hook(*model->up, [](torch::nn::Module&, at::Tensor out) { return out + 1; });
  const at::Tensor x = test_tensor({3, 6}, at::kDouble, 4);
  EXPECT_TRUE(tensors_close(call(model->up, x), model->up->forward(x * 2) + 1));
  EXPECT_TRUE(tensors_close(model->up(x), model->up->forward(x)));  // a direct call runs no hooks
  remove_forward_hooks(*model->up);
  EXPECT_TRUE(tensors_close(call(model->up, x), model->up->forward(x)));
}

}  // namespace
}  // namespace dtensor::testing
