// Checkpoints saved under one layout and loaded under another, for every pair of {one process, TP=4
// S(0), TP=4 S(1), DP2xTP2, uneven on 3 of the 4 ranks}, against the whole tensors bit for bit (0-d and
// zero-size tensors among them); what
// each rank writes and reads; asynchronous saves; crash safety and the errors for damaged or mismatched
// checkpoints.

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dtensor/checkpoint.h"
#include "dtensor/pieces.h"
#include "dtensor/world.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;

struct Layout {
  std::string name;
  MeshPtr mesh;          // null: plain tensors, as one process holds them
  Placements weight;     // for "w" [10, 7]
  Placements bias;       // for "b" [9]
};

std::vector<Layout> layouts() {
  return {
      {"one_process", nullptr, {}, {}},
      {"tp4_s0", mesh({4}), {Shard(0)}, {Shard(0)}},
      {"tp4_s1", mesh({4}), {Shard(1)}, {Replicate()}},
      {"dp2xtp2", mesh({2, 2}), {Replicate(), Shard(0)}, {Shard(0), Replicate()}},
      {"uneven", mesh({3}, {1, 2, 3}), {Shard(1)}, {Shard(0)}},  // rank 0 holds nothing
  };
}

// The whole tensors the state holds: integer-valued, so every dtype stores them exactly.
std::map<std::string, at::Tensor> whole_tensors() {
  return {{"w", test_tensor({10, 7}, at::kFloat, 1)},
          {"b", test_tensor({9}, at::kBFloat16, 2)},
          {"step", at::tensor(int64_t{41})},
          {"rows.int", test_tensor({5, 3}, at::kLong, 3)},
          {"empty", at::zeros({0, 4})}};
}

at::Tensor laid_out(const at::Tensor& whole, const Layout& layout, const Placements& placements) {
  if (!layout.mesh) return whole.clone();
  return make_dtensor_holding(whole, layout.mesh, placements);
}

ckpt::State state_in(const Layout& layout, bool zeros) {
  ckpt::State state;
  for (const auto& [name, whole] : whole_tensors()) {
    const at::Tensor value = zeros ? at::zeros_like(whole) : whole;
    if (name == "w" || name == "empty") state[name] = laid_out(value, layout, layout.weight);
    else if (name == "b") state[name] = laid_out(value, layout, layout.bias);
    else if (name == "rows.int" && layout.mesh) state[name] = laid_out(value, layout, Placements(layout.mesh->ndim(), Shard(0)));
    else state[name] = value.clone();  // the step: a plain tensor in every layout
  }
  return state;
}

::testing::AssertionResult holds_whole(const ckpt::State& state, const Layout& layout) {
  for (const auto& [name, whole] : whole_tensors()) {
    const at::Tensor& t = state.at(name);
    if (!is_dtensor(t)) {
      if (auto r = tensors_equal(t, whole); !r) return r << " (" << name << ")";
      continue;
    }
    if (!mesh_of(t)->contains_this_rank()) {  // a rank outside the mesh holds (and reads) nothing
      if (local_tensor_of(t).numel() != 0) return ::testing::AssertionFailure() << name << " holds data off its mesh";
      continue;
    }
    if (auto r = tensors_equal(local_tensor_of(t), expected_shard(whole, mesh_of(t), placements_of(t))); !r)
      return r << " (" << name << " under " << layout.name << ")";
  }
  return ::testing::AssertionSuccess();
}

int64_t local_bytes(const ckpt::State& state) {
  int64_t bytes = 0;
  for (const auto& [name, t] : state) {
    const at::Tensor& local = is_dtensor(t) ? local_tensor_of(t) : t;
    bytes += local.numel() * static_cast<int64_t>(local.element_size());
  }
  return bytes;
}

int64_t whole_bytes() {
  int64_t bytes = 0;
  for (const auto& [name, t] : whole_tensors()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

class CheckpointTest : public DistTest {};

TEST_F(CheckpointTest, EveryPairOfLayoutsLoadsBitForBit) {
  const fs::path root = shared_directory("layouts");
  for (const Layout& from : layouts()) {
    const fs::path dir = root / from.name;
    ckpt::save(state_in(from, false), dir.string(), {.world = world()});
    ASSERT_TRUE(ckpt::is_committed(dir.string()));
    // Every element is written once: Replicate pieces by one rank, plain tensors by rank 0.
    std::ifstream in(dir / "model.safetensors.index.json");
    const auto index = nlohmann::json::parse(in);
    EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), whole_bytes()) << from.name;
    // Hugging Face's weight_map: the tensors saved whole (plain or Replicate everywhere).
    size_t saved_whole = 0;
    for (const auto& [name, t] : state_in(from, true))
      saved_whole += !is_dtensor(t) || t.numel() == 0 || placements_of(t) == Placements(mesh_of(t)->ndim(), Replicate());
    EXPECT_EQ(index["weight_map"].size(), saved_whole) << from.name;
    for (const Layout& to : layouts()) {
      SCOPED_TRACE(from.name + " -> " + to.name);
      ckpt::State target = state_in(to, true);
      const ckpt::LoadResult result = ckpt::load(target, dir.string(), {.world = world()});
      EXPECT_TRUE(holds_whole(target, to));
      // Only the bytes of this rank's own shards are read.
      EXPECT_EQ(result.bytes_read, local_bytes(target));
    }
  }
}

TEST_F(CheckpointTest, WholeTensorsMakeOrdinaryHuggingFaceShards) {
  const fs::path root = shared_directory("whole");
  for (const Layout& from : layouts()) {
    const fs::path dir = root / from.name;
    ckpt::save(state_in(from, false), dir.string(), {.world = world(), .whole_tensors = true});
    std::ifstream in(dir / "model.safetensors.index.json");
    const auto index = nlohmann::json::parse(in);
    EXPECT_EQ(index["weight_map"].size(), whole_tensors().size()) << from.name;
    EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), whole_bytes()) << from.name;
    for (const Layout& to : layouts()) {
      SCOPED_TRACE(from.name + " -> " + to.name);
      ckpt::State target = state_in(to, true);
      EXPECT_EQ(ckpt::load(target, dir.string(), {.world = world()}).bytes_read, local_bytes(target));
      EXPECT_TRUE(holds_whole(target, to));
    }
  }
}

TEST_F(CheckpointTest, PartialTensorsAreSavedReduced) {
  const fs::path dir = shared_directory("partial");
  const at::Tensor whole = test_tensor({6, 5}, at::kFloat, 7);
  ckpt::State state = {{"p", make_dtensor_holding(whole, mesh({2, 2}), {Partial(ReduceOp::Sum), Shard(1)}, 3)}};
  ckpt::save(state, dir.string());
  ckpt::save(state, (dir / "whole").string(), {.whole_tensors = true});
  for (const fs::path& saved : {dir, dir / "whole"}) {
    ckpt::State target = {{"p", at::zeros({6, 5})}};
    ckpt::load(target, saved.string(), {.world = world()});
    EXPECT_TRUE(tensors_equal(target.at("p"), whole));
  }
}

// Optimizer steps were 1-element tensors before they became 0-d (as PyTorch's): such a checkpoint still
// loads into today's 0-d step, through TrainingState and node-local loading alike.
TEST_F(CheckpointTest, AStepSavedWithShapeOneLoadsIntoAZeroDimStep) {
  const fs::path dir = shared_directory("old_step");
  ckpt::save({{"optim.w.step", at::tensor({int64_t{7}})}}, dir.string(), {.world = world()});
  for (bool node_local : {false, true}) {
    ckpt::State target = {{"optim.w.step", at::scalar_tensor(0, at::kLong)}};
    ckpt::load(target, dir.string(), {.world = world(), .node_local = node_local});
    EXPECT_EQ(target.at("optim.w.step").dim(), 0);
    EXPECT_EQ(target.at("optim.w.step").item<int64_t>(), 7);
  }
}

// An asynchronous save writes the values the state held when it was called: the state is changed
// (in place, as an optimizer step would) while the files are written, before the future is waited on.
TEST_F(CheckpointTest, AsynchronousSaveWritesTheValuesOfTheMomentItWasCalled) {
  for (const Layout& from : layouts()) {
    SCOPED_TRACE(from.name);
    const fs::path dir = shared_directory("async_" + from.name);
    ckpt::State state = state_in(from, false);
    auto pending = ckpt::save_async(state, dir.string(), {.world = world()});
    for (auto& [name, t] : state) {
      at::Tensor local = is_dtensor(t) ? local_tensor_of(t) : t;
      if (local.numel() > 0) local.add_(1);
    }
    const ckpt::SaveResult saved = pending.get();
    EXPECT_TRUE(ckpt::is_committed(dir.string()));
    EXPECT_EQ(saved.bytes_written > 0, !saved.file.empty());
    for (const Layout& to : layouts()) {
      SCOPED_TRACE("loaded as " + to.name);
      ckpt::State target = state_in(to, true);
      ckpt::load(target, dir.string(), {.world = world()});
      EXPECT_TRUE(holds_whole(target, to));
    }
  }
}

// Node-local loading, with each rank given a directory of its own that holds some of a checkpoint's
// files, as node-local disks would: ranks 0 and 1 share "node A" (the files ranks 0 and 1 wrote), rank 2
// is "node B" (those of ranks 2 and 3), rank 3 a node that was not in the save (nothing). Each rank must
// end with its shard bit for bit, having received exactly the bytes its node lacks: the minimum, from
// the saved layout's pieces (the multi-node test does the same across network namespaces).
std::string rank_file(int writer) { return "model-0000" + std::to_string(writer + 1) + "-of-00004.safetensors"; }

std::vector<int> writers_on_node_of(int rank) {
  if (rank <= 1) return {0, 1};
  if (rank == 2) return {2, 3};
  return {};
}

int64_t bytes_held_on_node(const ckpt::State& target, const Layout& from, int rank) {
  const std::vector<int> writers = writers_on_node_of(rank);
  const auto written_here = [&](int64_t writer) { return std::find(writers.begin(), writers.end(), writer) != writers.end(); };
  const ckpt::State saved = state_in(from, true);
  int64_t bytes = 0;
  for (const auto& [name, t] : target) {
    if (t.numel() == 0 || (is_dtensor(t) && !mesh_of(t)->contains_this_rank())) continue;
    const Shape global = t.sizes().vec();
    const Box mine = is_dtensor(t) ? [&] {
      const LocalLayout l = local_layout(global, mesh_of(t)->shape(), *mesh_of(t)->coordinate(), placements_of(t));
      return Box{l.offset, l.shape};
    }()
                                   : Box{Shape(global.size(), 0), global};
    const at::Tensor& s = saved.at(name);
    const std::vector<Piece> pieces = is_dtensor(s) ? pieces_of(global, mesh_of(s)->shape(), mesh_of(s)->ranks(), placements_of(s))
                                                    : std::vector<Piece>{Piece{Box{Shape(global.size(), 0), global}, {0}}};
    for (const Piece& p : pieces)
      if (const auto part = intersect(p.box, mine); part && written_here(p.holders.front()))
        bytes += numel(part->shape) * static_cast<int64_t>(t.element_size());
  }
  return bytes;
}

TEST_F(CheckpointTest, NodeLocalLoadReadsWhatEachNodeHasAndReceivesTheRest) {
  const int rank = world()->rank();
  for (const Layout& from : {layouts()[1], layouts()[3], layouts()[4]}) {
    const fs::path saved = shared_directory("node_local_" + from.name);
    ckpt::save(state_in(from, false), saved.string(), {.world = world(), .node_local = true});
    std::ifstream in(saved / "model.safetensors.index.json");
    const auto nodes = nlohmann::json::parse(in)["dtensor"]["nodes"];  // on one host here: all on it
    ASSERT_EQ(nodes.size(), 4u) << from.name;
    for (const auto& [file, host] : nodes.items()) EXPECT_EQ(host.get<std::string>(), host_name()) << file;
    // This rank's "node" directory.
    const fs::path mine = saved.string() + "_rank" + std::to_string(rank);
    fs::create_directories(mine);
    for (const char* name : {"model.safetensors.index.json", "dtensor.commit"})
      if (!writers_on_node_of(rank).empty()) fs::copy_file(saved / name, mine / name, fs::copy_options::overwrite_existing);
    for (int writer : writers_on_node_of(rank))
      fs::copy_file(saved / rank_file(writer), mine / rank_file(writer),
                    fs::copy_options::overwrite_existing);
    world()->sum_across_ranks(0);
    for (const Layout& to : layouts()) {
      SCOPED_TRACE(from.name + " -> " + to.name);
      ckpt::State target = state_in(to, true);
      const ckpt::LoadResult result = ckpt::load(target, mine.string(), {.world = world(), .node_local = true});
      EXPECT_TRUE(holds_whole(target, to));
      EXPECT_EQ(result.bytes_received, local_bytes(target) - bytes_held_on_node(target, from, rank));
      EXPECT_EQ(world()->sum_across_ranks(result.bytes_sent), world()->sum_across_ranks(result.bytes_received));
    }
  }
  // A file on no node of the job: named, with the host that wrote it.
  const fs::path lost = shared_directory("node_local_lost");
  ckpt::save(state_in(layouts()[1], false), lost.string(), {.world = world(), .node_local = true});
  if (rank == 0) fs::remove(lost / "model-00003-of-00004.safetensors");
  world()->sum_across_ranks(0);
  EXPECT_THAT(error_of([&] { ckpt::load(state_in(layouts()[1], true), lost.string(), {.world = world(), .node_local = true}); }),
              ::testing::AllOf(::testing::HasSubstr("model-00003-of-00004.safetensors, written on " + host_name()),
                               ::testing::HasSubstr("is in no node's")));
}

// Rank 0 changes the saved files; every rank waits for it.
template <typename F>
void on_rank_zero(F&& f) {
  if (world()->rank() == 0) f();
  world()->sum_across_ranks(0);
}

void overwrite_bytes(const fs::path& file, std::streamoff at, const std::string& bytes) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(at);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST_F(CheckpointTest, DamagedOrMismatchedCheckpointsGiveClearErrors) {
  const fs::path root = shared_directory("errors");
  const Layout tp = layouts()[1];
  const auto saved = [&](const std::string& name) {
    const fs::path dir = root / name;
    ckpt::save(state_in(tp, false), dir.string(), {.world = world()});
    return dir;
  };
  const auto load_error = [&](const fs::path& dir, ckpt::State state, ckpt::LoadOptions options = {}) {
    options.world = world();
    return error_of([&] { ckpt::load(state, dir.string(), options); });
  };

  const fs::path truncated = saved("truncated");
  const fs::path second = truncated / "model-00002-of-00004.safetensors";
  on_rank_zero([&] { fs::resize_file(second, fs::file_size(second) - 5); });
  EXPECT_THAT(load_error(truncated, state_in(tp, true)),
              ::testing::AllOf(::testing::HasSubstr(second.string()), ::testing::HasSubstr("the file is truncated"),
                               ::testing::HasSubstr("tensor '")));

  const fs::path corrupted = saved("corrupted");
  on_rank_zero([&] { overwrite_bytes(corrupted / "model-00003-of-00004.safetensors", 8, "#"); });
  EXPECT_THAT(load_error(corrupted, state_in(tp, true)),
              ::testing::AllOf(::testing::HasSubstr("model-00003-of-00004.safetensors"),
                               ::testing::HasSubstr("not valid JSON, the file is corrupted")));

  const fs::path uncommitted = saved("uncommitted");
  on_rank_zero([&] { fs::remove(uncommitted / "dtensor.commit"); });
  EXPECT_THAT(load_error(uncommitted, state_in(tp, true)), ::testing::HasSubstr("its save did not finish"));
  EXPECT_FALSE(ckpt::is_committed(uncommitted.string()));

  const fs::path good = saved("good");
  ckpt::State more = state_in(tp, true);
  more["extra"] = at::zeros({2});
  more.erase("b");
  EXPECT_THAT(load_error(good, more), ::testing::AllOf(::testing::HasSubstr("missing from the checkpoint: extra"),
                                                       ::testing::HasSubstr("not in the state: b")));
  const ckpt::LoadResult partial = ckpt::load(more, good.string(), {.strict = false, .world = world()});
  EXPECT_EQ(partial.missing, std::vector<std::string>{"extra"});
  EXPECT_EQ(partial.unexpected, std::vector<std::string>{"b"});
  EXPECT_TRUE(tensors_equal(more.at("extra"), at::zeros({2})));
  EXPECT_TRUE(tensors_equal(local_tensor_of(more.at("w")), expected_shard(whole_tensors().at("w"), tp.mesh, tp.weight)));

  ckpt::State wrong_shape = state_in(tp, true);
  wrong_shape["w"] = distribute_tensor(at::zeros({10, 8}), tp.mesh, tp.weight);
  EXPECT_THAT(load_error(good, wrong_shape),
              ::testing::AllOf(::testing::HasSubstr("tensor 'w' has shape [10, 8]"),
                               ::testing::HasSubstr("holds it with shape [10, 7]"),
                               ::testing::HasSubstr("model-00001-of-00004.safetensors")));
  ckpt::State wrong_dtype = state_in(tp, true);
  wrong_dtype["w"] = distribute_tensor(at::zeros({10, 7}, at::kDouble), tp.mesh, tp.weight);
  EXPECT_THAT(load_error(good, wrong_dtype), ::testing::HasSubstr("tensor 'w' is Double but"));

  EXPECT_THAT(error_of([&] { ckpt::save(state_in(tp, false), good.string(), {.world = world()}); }),
              ::testing::HasSubstr("already holds a checkpoint"));
  // Plain tensors alone carry no world: every rank would save as the only one.
  EXPECT_THAT(error_of([&] { ckpt::save({{"x", at::zeros({2})}}, (root / "no_world").string()); }),
              ::testing::HasSubstr("no world was given, but 4 ranks were launched; pass the job's world"));
  EXPECT_THAT(error_of([&] { ckpt::save({{"__metadata__", at::zeros({2})}}, (root / "bad_name").string(), {.world = world()}); }),
              ::testing::HasSubstr("'__metadata__' is the safetensors header's own key"));
  ckpt::save(state_in(layouts()[3], false), good.string(), {.overwrite = true, .world = world()});
  ckpt::State reloaded = state_in(tp, true);
  ckpt::load(reloaded, good.string(), {.world = world()});
  EXPECT_TRUE(holds_whole(reloaded, tp));
}

}  // namespace
}  // namespace dtensor::testing
