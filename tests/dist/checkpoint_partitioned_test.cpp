// Partitioned checkpoints (SaveOptions::partitioned): ranks holding different tensors under names
// global to the model, as pipeline stages do. Saved from two stages of a (pp, tp) 2x2 mesh (DTensors
// sharded over tp, uneven; plain tensors; one tensor both stages hold), then loaded into one process
// and into four other stages on 4 ranks, against the whole tensors bit for bit; and the errors for
// stages that disagree on a tensor, for a DTensor shard its rank leaves out, for a tensor no stage
// saved, for a save without the world, and for ranks of which some save partitioned and some do not.

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dtensor/checkpoint.h"
#include "dtensor/world.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

namespace ckpt = dtensor::checkpoint;
using ::testing::HasSubstr;

// The model's whole tensors: integer-valued, so every dtype stores them exactly.
std::map<std::string, at::Tensor> stage_model() {
  return {{"layers.0.w", test_tensor({5, 3}, at::kFloat, 1)},   // stage 0, Shard(0) over tp: 3 + 2 rows
          {"layers.0.b", test_tensor({5}, at::kBFloat16, 2)},   // stage 0, plain
          {"layers.1.w", test_tensor({3, 7}, at::kFloat, 3)},   // stage 1, Shard(1) over tp: 4 + 3 columns
          {"layers.1.b", test_tensor({3}, at::kFloat, 4)},      // stage 1, plain
          {"mask", test_tensor({4, 4}, at::kFloat, 5)}};        // both stages, plain
}

// What pp rank `stage` of the (pp, tp) mesh `m` holds: its layer, sharded over tp, and the mask.
ckpt::State stage_state(int64_t stage, const MeshPtr& m, bool zeros) {
  const auto whole = stage_model();
  auto value = [&](const std::string& name) { return zeros ? at::zeros_like(whole.at(name)) : whole.at(name).clone(); };
  const std::string layer = "layers." + std::to_string(stage);
  const Placements sharded{stage == 0 ? Shard(0) : Shard(1)};
  return {{layer + ".w", make_dtensor_holding(value(layer + ".w"), (*m)["tp"], sharded)}, {layer + ".b", value(layer + ".b")}, {"mask", value("mask")}};
}

::testing::AssertionResult holds_model_part(const ckpt::State& state) {
  const auto whole = stage_model();
  for (const auto& [name, t] : state) {
    const at::Tensor expected = is_dtensor(t) ? expected_shard(whole.at(name), mesh_of(t), placements_of(t)) : whole.at(name);
    if (auto r = tensors_equal(is_dtensor(t) ? local_tensor_of(t) : t, expected); !r) return r << " (" << name << ")";
  }
  return ::testing::AssertionSuccess();
}

class PartitionedCheckpointTest : public DistTest {};

TEST_F(PartitionedCheckpointTest, TwoStagesLoadIntoOneProcessAndIntoFourOtherStagesBitForBit) {
  const MeshPtr m = mesh({2, 2}, {}, {"pp", "tp"});
  const std::string dir = shared_directory("two_stages").string();
  ckpt::save(stage_state(m->local_rank(0), m, false), dir, {.world = world(), .partitioned = true});
  // Every element written once, "mask" (which every rank holds) by rank 0 alone.
  std::ifstream in(std::filesystem::path(dir) / "model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  int64_t model_bytes = 0;
  for (const auto& [name, t] : stage_model()) model_bytes += t.numel() * static_cast<int64_t>(t.element_size());
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), model_bytes);
  EXPECT_EQ(index["weight_map"]["mask"], "model-00001-of-00004.safetensors");

  // The whole model, as one process would load it (on every rank).
  ckpt::State whole;
  for (const auto& [name, t] : stage_model()) whole[name] = at::zeros_like(t);
  ckpt::load(whole, dir, {.world = world()});
  EXPECT_TRUE(holds_model_part(whole));

  // Four stages, one per rank, cut elsewhere: rank 1 holds layer 0's weight sharded over ranks {1, 2},
  // rank 2 too, and layer 1's bias; the others plain tensors.
  const MeshPtr pair = mesh({2}, {1, 2});
  const auto zeros = stage_model();
  const int rank = world()->rank();
  ckpt::State part;
  if (rank == 0) part = {{"layers.0.b", at::zeros_like(zeros.at("layers.0.b"))}, {"mask", at::zeros_like(zeros.at("mask"))}};
  if (rank == 1 || rank == 2) part["layers.0.w"] = make_dtensor_holding(at::zeros_like(zeros.at("layers.0.w")), pair, {Shard(1)});
  if (rank == 2) part["layers.1.b"] = at::zeros_like(zeros.at("layers.1.b"));
  if (rank == 3) part = {{"layers.1.w", at::zeros_like(zeros.at("layers.1.w"))}};
  const ckpt::LoadResult result = ckpt::load(part, dir, {.world = world(), .partitioned = true});
  EXPECT_TRUE(result.missing.empty());
  EXPECT_TRUE(result.unexpected.empty());
  EXPECT_TRUE(holds_model_part(part));
}

TEST_F(PartitionedCheckpointTest, RefusesStagesThatDisagreeAndTensorsNoStageSaved) {
  const MeshPtr m = mesh({2, 2}, {}, {"pp", "tp"});
  const int rank = world()->rank();
  // Every rank holds "mask", rank 3 with another shape: the error names ranks 0 and 3 on every rank.
  ckpt::State state = stage_state(m->local_rank(0), m, false);
  if (rank == 3) state["mask"] = at::zeros({4, 5});
  EXPECT_THAT(error_of([&] { ckpt::save(state, shared_directory("disagree").string(), {.world = world(), .partitioned = true}); }),
              HasSubstr("ranks 0 and 3 both hold 'mask' but with shape [4,4] and [4,5]"));

  const std::string dir = shared_directory("saved").string();
  ckpt::save(stage_state(m->local_rank(0), m, false), dir, {.world = world(), .partitioned = true});
  ckpt::State asks_more = {{"layers.2.w", at::zeros({2})}};
  EXPECT_THAT(error_of([&] { ckpt::load(asks_more, dir, {.world = world(), .partitioned = true}); }),
              HasSubstr("missing from the checkpoint: layers.2.w"));

  // Rank 3 leaves out its shard of layer 1's weight, which rank 2 passes: refused on every rank.
  ckpt::State without = stage_state(m->local_rank(0), m, false);
  if (rank == 3) without.erase("layers.1.w");
  EXPECT_THAT(error_of([&] { ckpt::save(without, shared_directory("without").string(), {.world = world(), .partitioned = true}); }),
              HasSubstr("rank 3 holds a shard of 'layers.1.w' but did not pass it"));
  EXPECT_THAT(error_of([&] { ckpt::save(stage_state(m->local_rank(0), m, false), shared_directory("no_world").string(), {.partitioned = true}); }),
              HasSubstr("a partitioned save needs the job's world"));

  // Some ranks partitioned, some not: refused on every rank, with no hang.
  EXPECT_THAT(error_of([&] {
                ckpt::save(stage_state(m->local_rank(0), m, false), shared_directory("mixed").string(),
                           {.world = world(), .partitioned = rank != 1});
              }),
              HasSubstr("state differs from another rank's"));
}

}  // namespace
}  // namespace dtensor::testing
