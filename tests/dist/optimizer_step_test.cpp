// step_on_local_shards: LibTorch's Adam, AdamW and SGD stepped on the shards of DTensor parameters
// give the parameters and optimizer state of the same optimizer on the full tensors on one device,
// dispatch no DTensor op when gradients are placed like their parameters, and leave the optimizer
// over its DTensors (state included) so that a plain step or a checkpoint can follow; the same with
// Adam and AdamW fused into one ATen kernel per param group.

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "dtensor/comm_debug.h"
#include "dtensor/optim.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

struct Param {
  Shape shape;
  Placements placements;       // the parameter's
  Placements grad_placements;  // its gradient's (Partial: reduced by the step)
};

// Uneven shards (6 rows over 4 ranks: 2, 2, 2, 0), a column shard, a Replicate bias, a Partial
// gradient and one sharded unlike its parameter.
std::vector<Param> params_1d() {
  return {{{6, 5}, {Shard(0)}, {Shard(0)}},
          {{5, 7}, {Shard(1)}, {Shard(1)}},
          {{7}, {Replicate()}, {Partial()}},
          {{3, 4}, {Shard(0)}, {Shard(1)}}};
}

std::vector<Param> params_2d() {
  return {{{6, 5}, {Shard(0), Shard(1)}, {Shard(0), Shard(1)}},
          {{5, 3}, {Replicate(), Shard(0)}, {Partial(), Shard(0)}}};
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

struct Case {
  std::string name;
  MakeOptimizer make;
  std::string fused_kernel;  // the ATen operator a fused step on shards runs ("": none, LibTorch's step)
};

std::vector<Case> optimizers() {
  return {
      {"AdamW", [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.1)); },
       "aten::_fused_adamw_"},
      {"AdamW amsgrad",
       [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.1).amsgrad(true)); },
       "aten::_fused_adamw_"},
      {"Adam weight decay",
       [](auto p) { return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.1).weight_decay(0.1)); },
       "aten::_fused_adam_"},
      {"SGD nesterov", [](auto p) {
         return std::make_unique<torch::optim::SGD>(
             p, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
       },
       ""},
  };
}

// The optimizer state tensors of `param`, in a fixed order (undefined where the optimizer has none).
std::vector<at::Tensor> state_of(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto& state = *optimizer.state().at(param.unsafeGetTensorImpl());
  if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(&state))
    return {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
  if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(&state))
    return {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
  return {dynamic_cast<torch::optim::SGDParamState&>(state).momentum_buffer()};
}

// Three steps with new gradients each: the first two on local shards, the last a plain DTensor step
// (the state the shard steps made must serve it), against the optimizer on the full tensors.
void check_against_one_device(const MeshPtr& m, const std::vector<Param>& params, const Case& c,
                              const LocalStepOptions& step_options = {}) {
  std::vector<at::Tensor> full, dist;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor value = test_tensor(params[i].shape, at::kDouble, 30 + i) / 4;
    full.push_back(value.clone().requires_grad_());
    dist.push_back(make_dtensor_holding(value, m, params[i].placements).requires_grad_());
  }
  auto reference = c.make(full);
  auto optimizer = c.make(dist);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor grad = test_tensor(params[i].shape, at::kDouble, 100 * step + i) / 8;
      full[i].mutable_grad() = grad.clone();
      dist[i].mutable_grad() = make_dtensor_holding(grad, m, params[i].grad_placements, step);
    }
    reference->step();
    if (step < 2) {
      OpCounter fused(c.fused_kernel);
      step_on_local_shards(*optimizer, step_options);
      EXPECT_EQ(fused.count(), step_options.fused && !c.fused_kernel.empty() ? 1 : 0) << c.name;
    }
    else optimizer->step();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(is_dtensor(optimizer->param_groups()[0].params()[i])) << c.name;
      EXPECT_EQ(placements_of(dist[i]), params[i].placements);
      EXPECT_TRUE(tensors_close(full_tensor(dist[i]), full[i].detach(), 1e-12, 1e-12)) << c.name << ", step " << step;
      const auto expected = state_of(*reference, full[i]), actual = state_of(*optimizer, dist[i]);
      for (size_t k = 0; k < expected.size(); ++k) {
        ASSERT_EQ(actual[k].defined(), expected[k].defined()) << c.name << ", state " << k;
        if (!expected[k].defined()) continue;
        ASSERT_TRUE(is_dtensor(actual[k])) << c.name << ", state " << k;
        EXPECT_EQ(placements_of(actual[k]), params[i].placements);
        EXPECT_TRUE(tensors_close(full_tensor(actual[k]), expected[k], 1e-12, 1e-12)) << c.name << ", state " << k;
      }
    }
  }
}

class OptimizerTest : public DistTest {};

TEST_F(OptimizerTest, StepOnLocalShardsMatchesTheOptimizerOnOneDevice) {
  for (const Case& c : optimizers()) check_against_one_device(mesh({4}), params_1d(), c);
}

TEST_F(OptimizerTest, StepOnLocalShardsMatchesTheOptimizerOnOneDeviceOn2dMesh) {
  for (const Case& c : optimizers()) check_against_one_device(mesh({2, 2}), params_2d(), c);
}

// Adam and AdamW in ATen's fused kernel: the same update within rounding (fp64 here), the same
// LibTorch state objects, so that a plain DTensor step continues from them.
TEST_F(OptimizerTest, FusedStepOnLocalShardsMatchesTheOptimizerOnOneDevice) {
  for (const Case& c : optimizers()) check_against_one_device(mesh({4}), params_1d(), c, {.fused = true});
  for (const Case& c : optimizers()) check_against_one_device(mesh({2, 2}), params_2d(), c, {.fused = true});
}

// With gradients placed like their parameters the step dispatches no DTensor op at all (the DTensor
// step dispatches several per parameter).
TEST_F(OptimizerTest, StepOnLocalShardsDispatchesNoDTensorOp) {
  auto m = mesh({4});
  std::vector<at::Tensor> params;
  for (const Param& p : params_1d()) {
    params.push_back(make_dtensor_holding(test_tensor(p.shape, at::kDouble, 1), m, p.placements).requires_grad_());
    params.back().mutable_grad() = make_dtensor_holding(test_tensor(p.shape, at::kDouble, 2), m, p.placements);
  }
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(0.1));
  {
    CommDebugMode debug;
    step_on_local_shards(optimizer);
    EXPECT_TRUE(debug.ops().empty()) << debug.ops().size() << " ops, first " << debug.ops().front();
  }
  CommDebugMode debug;
  optimizer.step();
  EXPECT_GE(debug.ops().size(), 8 * params.size());
}

// State made by a plain DTensor step from a Partial gradient is Partial itself (SGD's momentum is a
// clone of the gradient); the step on shards reduces it first instead of mixing contributions.
TEST_F(OptimizerTest, StepOnLocalShardsPlacesStateLikeItsParameter) {
  auto m = mesh({4});
  const at::Tensor value = test_tensor({6, 5}, at::kDouble, 5) / 4;
  at::Tensor p = distribute_tensor(value, m).requires_grad_();
  const at::Tensor fp = value.clone().requires_grad_();
  const auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
  torch::optim::SGD optimizer({p}, options), reference({fp}, options);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor grad = test_tensor({6, 5}, at::kDouble, 40 + step) / 8;
    p.mutable_grad() = make_dtensor_holding(grad, m, {Partial()}, step);
    fp.mutable_grad() = grad.clone();
    if (step == 0) optimizer.step();
    else step_on_local_shards(optimizer);
    reference.step();
    EXPECT_TRUE(tensors_close(full_tensor(p), fp.detach(), 1e-12, 1e-12)) << "step " << step;
  }
  EXPECT_EQ(placements_of(state_of(optimizer, p)[0]), (Placements{Replicate()}));
}

// A parameter listed twice (tied weights) keeps one state and is stepped twice, as optimizer.step()
// does on one device.
TEST_F(OptimizerTest, StepOnLocalShardsKeepsOneStateForATiedParameter) {
  auto m = mesh({4});
  const at::Tensor value = test_tensor({6, 5}, at::kDouble, 6) / 4;
  at::Tensor p = distribute_tensor(value, m, Placements{Shard(0)}).requires_grad_();
  const at::Tensor fp = value.clone().requires_grad_();
  const auto options = torch::optim::AdamWOptions(0.1);
  torch::optim::AdamW optimizer(std::vector<at::Tensor>{p, p}, options), reference(std::vector<at::Tensor>{fp, fp}, options);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor grad = test_tensor({6, 5}, at::kDouble, 50 + step) / 8;
    p.mutable_grad() = distribute_tensor(grad, m, Placements{Shard(0)});
    fp.mutable_grad() = grad.clone();
    step_on_local_shards(optimizer);
    reference.step();
    EXPECT_TRUE(tensors_close(full_tensor(p), fp.detach(), 1e-12, 1e-12)) << "step " << step;
  }
  EXPECT_EQ(dynamic_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl())).step(), 6);
  EXPECT_EQ(optimizer.state().size(), 1u);
}

TEST_F(OptimizerTest, StepOnLocalShardsRefusesOptimizersThatMayMixElements) {
  auto m = mesh({4});
  at::Tensor p = distribute_tensor(test_tensor({4, 4}, at::kDouble, 3), m, Placements{Shard(0)}).requires_grad_();
  p.mutable_grad() = distribute_tensor(test_tensor({4, 4}, at::kDouble, 4), m, Placements{Shard(0)});
  torch::optim::RMSprop optimizer({p}, torch::optim::RMSpropOptions(0.1));
  const std::string error = error_of([&] { step_on_local_shards(optimizer); });
  EXPECT_NE(error.find("supports Adam, AdamW and SGD"), std::string::npos) << error;
  EXPECT_TRUE(optimizer.param_groups()[0].params()[0].is_same(p));
  // A Partial parameter: Adam's squared gradients need its value.
  at::Tensor partial = make_dtensor_holding(test_tensor({4, 4}, at::kDouble, 5), m, {Partial()}).requires_grad_();
  partial.mutable_grad() = make_dtensor_holding(test_tensor({4, 4}, at::kDouble, 6), m, {Partial()});
  torch::optim::Adam adam({partial}, torch::optim::AdamOptions(0.1));
  const std::string refused = error_of([&] { step_on_local_shards(adam); });
  EXPECT_NE(refused.find("a parameter is Partial"), std::string::npos) << refused;
  EXPECT_TRUE(adam.param_groups()[0].params()[0].is_same(partial));
}

}  // namespace
}  // namespace dtensor::testing
