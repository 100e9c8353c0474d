// A training job's state (parameters, AdamW moments and step counters, SGD momentum) saved under
// tensor parallelism over 4 ranks and loaded into a DP2 x TP2 job: every tensor arrives whole, and the
// next step equals the uninterrupted job's.

#include <filesystem>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "dtensor/parallel.h"
#include "dtensor/training_state.h"
#include "test_modules.h"

namespace dtensor::testing {
namespace {

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;

class CheckpointTrainingTest : public DistTest {};

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<at::Tensor> params) {
  if (kind == "adamw")
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.05).amsgrad(true));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.5));
}

// One step on x; `scale` makes a dp-replicated batch's summed gradients the single batch's.
void step(TwoLayer& model, torch::optim::Optimizer& optimizer, const at::Tensor& x, double scale) {
  optimizer.zero_grad();
  call(model, x).pow(2).sum().mul(scale).backward();
  optimizer.step();
}

at::Tensor whole(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t) : t; }

TEST_F(CheckpointTrainingTest, OptimizerStateMovesFromTensorParallelToDataTimesTensorParallel) {
  const fs::path root = shared_directory("training");
  const at::Tensor x = test_tensor({4, 6}, at::kDouble, 3);
  for (const std::string kind : {"adamw", "sgd"}) {
    SCOPED_TRACE(kind);
    auto source = seeded<TwoLayer>(6, 10);  // hidden 10 over 4 ranks: shards of 3, 3, 3 and 1
    parallelize_module(*source, mesh({4}), {{"up", ColwiseParallel{}}, {"down", RowwiseParallel{}}});
    auto source_optimizer = make_optimizer(kind, source->parameters());
    // Built before the first step, as a job does: it reads the optimizer's state when it saves.
    ckpt::TrainingState saved(*source, source_optimizer.get());
    step(source, *source_optimizer, x, 1.0);
    step(source, *source_optimizer, x, 1.0);
    saved.save((root / kind).string());

    torch::manual_seed(99);  // other initial values, so that only the load can make them equal
    TwoLayer target(6, 10);
    target->to(at::kDouble);
    parallelize_module(*target, mesh({2, 2}, {}, {"dp", "tp"}), {{"up", ColwiseParallel{}}, {"down", RowwiseParallel{}}},
                       {.tp_dim = "tp"});
    auto target_optimizer = make_optimizer(kind, target->parameters());
    ckpt::TrainingState loaded(*target, target_optimizer.get());
    const ckpt::LoadResult result = loaded.load((root / kind).string());
    EXPECT_TRUE(result.missing.empty() && result.unexpected.empty());
    // The optimizer's state was made from the checkpoint; a second save of both holds the same tensors.
    saved.save((root / (kind + "-source")).string());
    loaded.save((root / (kind + "-target")).string());
    ckpt::State source_tensors, target_tensors;
    for (const auto& [name, info] : ckpt::contents((root / (kind + "-source")).string())) {
      source_tensors[name] = at::zeros(info.shape, info.dtype);
      target_tensors[name] = at::zeros(info.shape, info.dtype);
    }
    EXPECT_EQ(source_tensors.size(), kind == "adamw" ? 4u * 5u : 4u * 2u);  // 4 parameters: themselves and their state
    ckpt::load(source_tensors, (root / (kind + "-source")).string(), {.world = world()});
    ckpt::load(target_tensors, (root / (kind + "-target")).string(), {.world = world()});
    for (const auto& [name, t] : source_tensors) EXPECT_TRUE(tensors_equal(target_tensors.at(name), t)) << name;
    if (kind == "adamw")
      for (const auto& p : target->parameters())
        EXPECT_EQ(static_cast<torch::optim::AdamWParamState&>(*target_optimizer->state().at(p.unsafeGetTensorImpl())).step(), 2);

    step(source, *source_optimizer, x, 1.0);
    step(target, *target_optimizer, x, 0.5);  // both dp ranks hold the batch: their gradients are summed
    const auto expected = source->named_parameters();
    for (const auto& p : target->named_parameters())
      EXPECT_TRUE(tensors_close(whole(p.value()), whole(expected[p.key()]), 1e-10, 1e-12)) << p.key();
  }
}

}  // namespace
}  // namespace dtensor::testing
