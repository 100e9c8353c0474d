// get_state_dict / set_state_dict against one process: a TP module's state taken whole or as it lives and
// set into modules of other layouts (a 2x2 mesh to 4 ranks, uneven and empty shards, a plain module),
// with Adam's state, rank 0's dict broadcast, and strict keys.

#include <torch/optim/adam.h>

#include "dtensor/parallel.h"
#include "dtensor/state_dict.h"
#include "test_modules.h"

namespace dtensor::testing {
namespace {

using checkpoint::StateDict;
using checkpoint::StateDictOptions;

constexpr StateDictOptions kFull{.full_state_dict = true};

// up [6, 5] column-parallel, down [5, 6] row-parallel: 6 over 4 ranks is 2, 2, 2, 0.
TwoLayer parallel_two_layer(const MeshPtr& m, uint64_t seed, const std::string& tp_dim = "") {
  torch::manual_seed(seed);
  TwoLayer model(5, 6);
  model->to(at::kDouble);
  parallelize_module(*model, m, {{"up", ColwiseParallel{}}, {"down", RowwiseParallel{}}}, {.tp_dim = tp_dim});
  return model;
}

at::Tensor gathered(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t) : t; }

void expect_values_of(torch::nn::Module& module, torch::nn::Module& reference, double tolerance = 0) {
  for (const auto& item : reference.named_parameters()) {
    const at::Tensor mine = gathered(module.named_parameters()[item.key()].detach());
    EXPECT_TRUE(tolerance == 0 ? at::equal(mine, item.value()) : at::allclose(mine, item.value(), tolerance, tolerance)) << item.key();
  }
}

class StateDictTest : public DistTest {};

TEST_F(StateDictTest, AFullStateDictIsTheWholeModuleAndAShardedOneItsDTensors) {
  auto tp = parallel_two_layer(mesh({2, 2}, {}, {"dp", "tp"}), 7, "tp");
  auto reference = seeded<TwoLayer>(5, 6);
  const StateDict full = checkpoint::get_model_state_dict(*tp, kFull);
  ASSERT_EQ(full.size(), reference->named_parameters().size());
  for (const auto& item : reference->named_parameters()) {
    EXPECT_FALSE(is_dtensor(full.at(item.key())));
    EXPECT_TRUE(at::equal(full.at(item.key()), item.value())) << item.key();
  }
  const StateDict sharded = checkpoint::get_model_state_dict(*tp);
  EXPECT_EQ(placements_of(sharded.at("up.weight")), placements_of(tp->up->weight));
  EXPECT_TRUE(at::equal(to_local(sharded.at("up.weight")), to_local(tp->up->weight)));
}

TEST_F(StateDictTest, EitherFormSetsAModuleOfAnotherLayout) {
  auto from = parallel_two_layer(mesh({2, 2}, {}, {"dp", "tp"}), 7, "tp");
  auto reference = seeded<TwoLayer>(5, 6);
  const StateDict full = checkpoint::get_model_state_dict(*from, kFull);
  const StateDict sharded = checkpoint::get_model_state_dict(*from);

  auto into = parallel_two_layer(mesh({4}), 99);
  EXPECT_TRUE(checkpoint::set_model_state_dict(*into, full, kFull).missing.empty());
  expect_values_of(*into, *reference);

  auto moved = parallel_two_layer(mesh({4}), 99);
  checkpoint::set_model_state_dict(*moved, sharded);  // DTensors of the 2x2 mesh, moved across meshes
  expect_values_of(*moved, *reference);

  torch::manual_seed(99);
  TwoLayer plain(5, 6);
  plain->to(at::kDouble);
  checkpoint::set_model_state_dict(*plain, sharded);
  expect_values_of(*plain, *reference);
}

TEST_F(StateDictTest, RankZerosFullDictIsBroadcastAndItsProblemsRaisedEverywhere) {
  const bool rank0 = world()->rank() == 0;
  auto reference = seeded<TwoLayer>(5, 6);
  StateDict given;
  if (rank0)
    for (const auto& item : reference->named_parameters()) given[item.key()] = item.value();
  auto into = parallel_two_layer(mesh({4}), 99);
  const StateDictOptions from_rank0{.full_state_dict = true, .broadcast_from_rank0 = true};
  checkpoint::set_model_state_dict(*into, given, from_rank0);
  expect_values_of(*into, *reference);

  StateDict wrong;
  if (rank0) wrong["up.weight"] = at::zeros({3, 3}, at::kDouble);
  EXPECT_THAT(error_of([&] { checkpoint::set_model_state_dict(*into, wrong, from_rank0); }),
              ::testing::HasSubstr("'up.weight' has the shape [3, 3], but the module's is [6, 5]"));
}

TEST_F(StateDictTest, StrictKeysAndWhatANonStrictSetReports) {
  auto reference = seeded<TwoLayer>(5, 6);
  StateDict given = checkpoint::get_model_state_dict(*reference);
  given.erase("down.bias");
  given["nope"] = at::zeros({1});
  auto into = parallel_two_layer(mesh({4}), 99);
  const at::Tensor bias_before = gathered(into->down->bias).clone();
  EXPECT_THAT(error_of([&] { checkpoint::set_model_state_dict(*into, given); }),
              ::testing::HasSubstr("1 entries missing and 1 unexpected (the first: 'down.bias')"));
  const auto keys = checkpoint::set_model_state_dict(*into, given, {.strict = false});
  EXPECT_EQ(keys.missing, (std::vector<std::string>{"down.bias"}));
  EXPECT_EQ(keys.unexpected, (std::vector<std::string>{"nope"}));
  EXPECT_TRUE(at::equal(gathered(into->up->weight), reference->up->weight));
  EXPECT_TRUE(at::equal(gathered(into->down->bias), bias_before));
}

// Adam's state taken from a TP run and set into a fresh TP module and optimizer whose shards lie on other
// ranks (a 1-d mesh in another rank order; a 2-d mesh would read x as each data-parallel rank's own
// batch): the next step equals one process's second step.
TEST_F(StateDictTest, AdamStateCarriesTrainingAcrossLayouts) {
  const at::Tensor x = test_tensor({3, 5}, at::kDouble, 31) / 8;
  auto step = [&](TwoLayer& model, torch::optim::Optimizer& optimizer) {
    optimizer.zero_grad();
    call(model, x).pow(2).sum().backward();
    optimizer.step();
  };
  auto reference = seeded<TwoLayer>(5, 6);
  torch::optim::Adam reference_adam(reference->parameters(), torch::optim::AdamOptions(0.05));
  step(reference, reference_adam);

  auto from = parallel_two_layer(mesh({4}), 7);
  torch::optim::Adam from_adam(from->parameters(), torch::optim::AdamOptions(0.05));
  step(from, from_adam);
  const auto [model_state, optimizer_state] = checkpoint::get_state_dict(*from, from_adam, kFull);
  const auto& reference_moments =
      static_cast<torch::optim::AdamParamState&>(*reference_adam.state().at(reference->up->weight.unsafeGetTensorImpl()));
  EXPECT_TRUE(at::allclose(optimizer_state.at("up.weight.exp_avg"), reference_moments.exp_avg(), 1e-12, 1e-12));
  EXPECT_EQ(optimizer_state.at("up.weight.step").item<int64_t>(), 1);

  auto into = parallel_two_layer(mesh({4}, {3, 1, 2, 0}), 99);
  torch::optim::Adam into_adam(into->parameters(), torch::optim::AdamOptions(0.05));
  checkpoint::set_state_dict(*into, into_adam, model_state, optimizer_state, kFull);
  step(into, into_adam);
  step(reference, reference_adam);
  expect_values_of(*into, *reference, 1e-12);
}

}  // namespace
}  // namespace dtensor::testing
