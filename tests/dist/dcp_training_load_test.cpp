// A PyTorch trainer's checkpoint resumed in dtensor: scripts/write_dcp_training_checkpoint.py trains a
// model under TP=2 x FSDP=2 with AdamW for two steps and dcp.save's get_state_dict's model and optimizer
// dicts from 4 Gloo ranks. Here the same model, laid out otherwise (TP=4, FSDP=4, TP=2 x FSDP=2 on a mesh
// of the other rank order, one process), takes it through PyTorch's recipe (get_state_dict, dcp::load,
// set_state_dict), and its whole state must then be, bit for bit, what PyTorch's full_state_dict held
// (the script's expected/model.safetensors); the optimizer's options come from the param_groups entries.

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <filesystem>

#include "../support/build_paths.h"
#include "dtensor/dcp.h"
#include "dtensor/fsdp.h"
#include "dtensor/parallel.h"
#include "dtensor/state_dict.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

namespace ckpt = dtensor::checkpoint;
namespace dcp = dtensor::checkpoint::dcp;

const std::filesystem::path kTrainerCheckpoint = std::filesystem::path(build_paths::checkpoint_interop) / "dcp_training";

// The script's TrainNet: names and shapes only (the test loads into it, it does not run it).
struct TrainBlockImpl : torch::nn::Module {
  TrainBlockImpl() : w1(register_module("w1", torch::nn::Linear(6, 10))), w2(register_module("w2", torch::nn::Linear(10, 6))) {}
  torch::nn::Linear w1, w2;
};
TORCH_MODULE(TrainBlock);

struct TrainNetImpl : torch::nn::Module {
  TrainNetImpl()
      : emb(register_module("emb", torch::nn::Embedding(11, 6))),
        layers(register_module("layers", torch::nn::ModuleList(TrainBlock(), TrainBlock()))),
        head(register_module("head", torch::nn::Linear(torch::nn::LinearOptions(6, 5).bias(false)))) {}
  torch::nn::Embedding emb;
  torch::nn::ModuleList layers;
  torch::nn::Linear head;
};
TORCH_MODULE(TrainNet);

enum class TrainerLayout { Tp4, Fsdp4, TpThenFsdp2x2, OneProcess };

const ParallelizePlan kTrainerTpPlan = {{"layers.*.w1", ColwiseParallel{}}, {"layers.*.w2", RowwiseParallel{}}};

void fully_shard_trainer_net(TrainNet& net, const MeshPtr& m) {
  for (const auto& block : *net->layers) fully_shard(*block, m);
  fully_shard(*net, m);
}

// A fresh model (other values than the checkpoint's: seed 1 against PyTorch's 0) laid out as `layout`.
TrainNet trainer_net_laid_out(TrainerLayout layout) {
  torch::manual_seed(1);
  TrainNet net;
  switch (layout) {
    case TrainerLayout::Tp4:
      parallelize_module(*net, mesh({4}), kTrainerTpPlan);
      break;
    case TrainerLayout::Fsdp4:
      fully_shard_trainer_net(net, mesh({4}));
      break;
    case TrainerLayout::TpThenFsdp2x2: {  // tp on the mesh's first dim: each rank holds other pieces than it saved
      const MeshPtr m = mesh({2, 2}, {}, {"tp", "dp"});
      parallelize_module(*net, (*m)["tp"], kTrainerTpPlan);
      fully_shard_trainer_net(net, m);
      break;
    }
    case TrainerLayout::OneProcess:
      break;
  }
  return net;
}

// PyTorch's whole state as the script saved it, by DCP's names.
ckpt::State pytorch_full_state(const ckpt::State& like) {
  ckpt::State expected;
  for (const auto& [name, tensor] : like) expected[name] = at::zeros(tensor.sizes(), at::kFloat);
  ckpt::LoadOptions options;
  options.world = world();
  ckpt::load(expected, (kTrainerCheckpoint / "expected").string(), options);  // strict: the file holds exactly these names
  return expected;
}

class DcpTrainingLoadTest : public DistTest {};

TEST_F(DcpTrainingLoadTest, ResumesATpFsdpTrainersCheckpointOnOtherMeshesBitForBit) {
  for (TrainerLayout layout : {TrainerLayout::Tp4, TrainerLayout::Fsdp4, TrainerLayout::TpThenFsdp2x2, TrainerLayout::OneProcess}) {
    SCOPED_TRACE("layout " + std::to_string(static_cast<int>(layout)));
    TrainNet net = trainer_net_laid_out(layout);
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1.0).weight_decay(0).betas({0.5, 0.5}).eps(1e-3).amsgrad(true));

    // The options first: amsgrad decides which state entries the optimizer has.
    ckpt::set_param_groups(*net, optimizer, dcp::read_objects((kTrainerCheckpoint / "checkpoint").string(), "optim.param_groups."));
    const auto& set = static_cast<const torch::optim::AdamWOptions&>(optimizer.param_groups()[0].options());
    EXPECT_EQ(set.lr(), 0.05);
    EXPECT_EQ(set.weight_decay(), 0.1);
    EXPECT_EQ(set.betas(), std::make_tuple(0.9, 0.999));
    EXPECT_EQ(set.eps(), 1e-8);
    EXPECT_FALSE(set.amsgrad());

    auto [model_sd, optim_sd] = ckpt::get_state_dict(*net, optimizer);
    ckpt::LoadOptions options;
    options.world = world();  // the one-process layout holds no DTensor to bring it
    const ckpt::LoadResult result = dcp::load(dcp::pytorch_training_state(model_sd, optim_sd), (kTrainerCheckpoint / "checkpoint").string(), options);
    EXPECT_EQ(result.skipped.size(), 12u);  // AdamW's param_groups entries: lr, betas, eps, ...
    ckpt::set_state_dict(*net, optimizer, model_sd, optim_sd);

    const auto [full_model, full_optim] = ckpt::get_state_dict(*net, optimizer, {.full_state_dict = true});
    const ckpt::State full = dcp::pytorch_training_state(full_model, full_optim);
    const ckpt::State expected = pytorch_full_state(full);
    ASSERT_EQ(full.size(), 40u);  // 10 parameters, each with exp_avg, exp_avg_sq and step
    for (const auto& [name, tensor] : full) {
      // PyTorch's step is float32 (2.0), dtensor's int64 (2): equal as numbers; the rest float32 alike.
      EXPECT_TRUE(tensors_equal(tensor.to(at::kFloat), expected.at(name))) << name;
    }
  }
}

// What cannot be set is refused with the entry named, and the optimizer keeps its options.
TEST_F(DcpTrainingLoadTest, RefusesParamGroupsThatDoNotFitTheOptimizer) {
  TrainNet net = trainer_net_laid_out(TrainerLayout::OneProcess);
  auto groups = dcp::read_objects((kTrainerCheckpoint / "checkpoint").string(), "optim.param_groups.");
  ASSERT_EQ(groups.size(), 12u);
  EXPECT_EQ(groups.at("optim.param_groups.0.lr").toDouble(), 0.05);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1.0));
  EXPECT_THAT(error_of([&] { ckpt::set_param_groups(*net, adam, groups); }),
              ::testing::HasSubstr("'optim.param_groups.0.decoupled_weight_decay' is True (an AdamW was saved)"));
  EXPECT_EQ(adam.param_groups()[0].options().get_lr(), 1.0);

  std::vector<at::Tensor> reversed = net->parameters();
  std::reverse(reversed.begin(), reversed.end());
  torch::optim::AdamW shuffled(reversed, torch::optim::AdamWOptions(1.0));
  EXPECT_THAT(error_of([&] { ckpt::set_param_groups(*net, shuffled, groups); }),
              ::testing::HasSubstr("'optim.param_groups.0.params' names other parameters"));

  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1.0));
  groups["optim.param_groups.0.lr"] = std::string("fast");
  EXPECT_THAT(error_of([&] { ckpt::set_param_groups(*net, adamw, groups); }), ::testing::HasSubstr("'optim.param_groups.0.lr' is String"));
  groups["optim.param_groups.0.lr"] = 0.05;
  groups["optim.param_groups.0.lookahead"] = true;
  EXPECT_THAT(error_of([&] { ckpt::set_param_groups(*net, adamw, groups); }), ::testing::HasSubstr("'optim.param_groups.0.lookahead' is an option"));
  groups.erase("optim.param_groups.0.lookahead");
  for (const char* stray : {"optim.param_groups.1.lr", "optim.param_groups.00.lr", "optim.param_groups.0"}) {
    groups[stray] = 0.05;
    EXPECT_THAT(error_of([&] { ckpt::set_param_groups(*net, adamw, groups); }), ::testing::HasSubstr("belongs to no group of this optimizer"))
        << stray;
    groups.erase(stray);
  }
  EXPECT_EQ(adamw.param_groups()[0].options().get_lr(), 1.0);
  // What an LR scheduler adds to each group is not an option of the step: accepted.
  groups["optim.param_groups.0.initial_lr"] = 0.05;
  ckpt::set_param_groups(*net, adamw, groups);
  EXPECT_EQ(adamw.param_groups()[0].options().get_lr(), 0.05);
}

}  // namespace
}  // namespace dtensor::testing
