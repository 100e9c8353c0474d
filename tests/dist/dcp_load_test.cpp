// PyTorch DCP checkpoints (FileSystemWriter's .distcp files and .metadata) loaded with dcp::load onto
// other meshes and placements than they were saved from: scripts/write_dcp_checkpoints.py's 4-rank 2 x 2
// save (uneven shards) and its one-process save, into a 1-d mesh of 4 with Shard(1), a 2 x 2 mesh with
// other placements, and plain tensors on every rank; each compared bit for bit with the values the
// script saved (scripts/checkpoint_values.py's formula, computed here on its own).

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../support/build_paths.h"
#include "dtensor/dcp.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

namespace dcp = dtensor::checkpoint::dcp;
namespace ckpt = dtensor::checkpoint;
using ::testing::HasSubstr;

std::string dcp_written(const std::string& name) { return std::string(build_paths::checkpoint_interop) + "/dcp_written/" + name; }

struct DcpSavedTensor {
  std::string name;
  Shape shape;
  at::ScalarType dtype;
};

// scripts/write_dcp_checkpoints.py's TENSORS, in its order (the index is value()'s).
const std::vector<DcpSavedTensor> kDcpSaved = {{"w", {7, 5}, at::kFloat},     {"emb.weight", {10, 3}, at::kBFloat16},
                                         {"bias", {5}, at::kHalf},      {"counts", {3, 2}, at::kLong},
                                         {"scale", {}, at::kDouble},    {"mask", {4}, at::kBool}};

at::Tensor dcp_saved_value(size_t index) {
  const DcpSavedTensor& t = kDcpSaved[index];
  int64_t n = 1;
  for (int64_t s : t.shape) n *= s;
  at::Tensor x = at::arange(n, at::kDouble).remainder(97).sub(48).mul(0.25).add(static_cast<double>(index));
  if (t.dtype == at::kLong) x = x.mul(4);
  return x.reshape(t.shape).to(t.dtype);
}

// The value the script saved as `name`.
at::Tensor dcp_expected_value(const std::string& name) {
  if (name == "nested.inner") return at::arange(6, at::kInt).reshape({2, 3});
  for (size_t i = 0; i < kDcpSaved.size(); ++i)
    if (kDcpSaved[i].name == name) return dcp_saved_value(i);
  throw std::runtime_error("no value for " + name);
}

enum class DcpTarget { OneDimShard1, TwoDimOther, Plain };

Placements dcp_placements_for(DcpTarget layout, const std::string& name, int64_t ndim) {
  if (layout == DcpTarget::OneDimShard1) return {ndim >= 2 ? Shard(1) : Shard(0)};
  // 2 x 2, unlike the save's: w [Shard(0), Shard(1)] -> [Shard(1), Replicate]; emb [Shard(1), Shard(0)] -> [Replicate, Shard(0)]...
  if (name == "w") return {Shard(1), Replicate()};
  if (name == "emb.weight") return {Replicate(), Shard(0)};
  if (name == "counts") return {Shard(0), Shard(1)};
  if (name == "nested.inner") return {Shard(1), Shard(0)};
  return {Shard(0), Shard(0)};  // bias (5), mask (4): uneven over 4
}

// Zeros of each tensor's shape and dtype, laid out as `layout` (0-d tensors plain).
ckpt::State dcp_empty_state(const std::vector<std::string>& names, DcpTarget layout) {
  ckpt::State state;
  for (const std::string& name : names) {
    const at::Tensor like = dcp_expected_value(name);
    const at::Tensor zeros = at::zeros_like(like);
    if (layout == DcpTarget::Plain || like.dim() == 0) {
      state[name] = zeros;
      continue;
    }
    const MeshPtr m = layout == DcpTarget::OneDimShard1 ? mesh({4}) : mesh({2, 2});
    state[name] = make_dtensor_holding(zeros, m, dcp_placements_for(layout, name, like.dim()));
  }
  return state;
}

struct DcpCheckpoint {
  const char* dir;
  std::vector<std::string> tensors;
  std::vector<std::string> bytes;
};

const std::vector<DcpCheckpoint> kDcpCheckpoints = {
    {"dcp_sharded", {"w", "emb.weight", "bias", "counts", "scale", "mask"}, {"step", "tag"}},
    {"dcp_single", {"w", "emb.weight", "bias", "counts", "scale", "mask", "nested.inner"}, {"history", "step", "tag"}},
};

class DcpLoadTest : public DistTest {};

TEST_F(DcpLoadTest, LoadsPyTorchsCheckpointsOntoOtherMeshesAndLayouts) {
  for (const DcpCheckpoint& c : kDcpCheckpoints) {
    for (DcpTarget layout : {DcpTarget::OneDimShard1, DcpTarget::TwoDimOther, DcpTarget::Plain}) {
      SCOPED_TRACE(std::string(c.dir) + " layout " + std::to_string(static_cast<int>(layout)));
      ckpt::State state = dcp_empty_state(c.tensors, layout);
      ckpt::LoadOptions options;
      options.world = world();  // the plain layout has no DTensor to bring one
      const ckpt::LoadResult result = dcp::load(state, dcp_written(c.dir), options);
      EXPECT_TRUE(result.missing.empty());
      EXPECT_TRUE(result.unexpected.empty());
      EXPECT_EQ(result.skipped, c.bytes);
      int64_t own_bytes = 0;
      for (const std::string& name : c.tensors) {
        SCOPED_TRACE(name);
        const at::Tensor& t = state.at(name);
        const at::Tensor want = dcp_expected_value(name);
        if (!is_dtensor(t)) {
          EXPECT_TRUE(tensors_equal(t, want));
          own_bytes += t.numel() * static_cast<int64_t>(t.element_size());
          continue;
        }
        const at::Tensor& local = local_tensor_of(t);
        EXPECT_TRUE(tensors_equal(local, expected_shard(want, spec_of(t).mesh, placements_of(t))));
        own_bytes += local.numel() * static_cast<int64_t>(local.element_size());
      }
      EXPECT_EQ(result.bytes_read, own_bytes);  // each rank copies its own elements, once
    }
  }
}

TEST_F(DcpLoadTest, RefusesMismatchesOnEveryRank) {
  const std::string dir = dcp_written("dcp_sharded");
  const std::vector<std::string> names = kDcpCheckpoints[0].tensors;
  {  // a tensor the checkpoint lacks, strict
    ckpt::State state = dcp_empty_state(names, DcpTarget::OneDimShard1);
    state["ghost"] = make_dtensor_holding(at::zeros({4}), mesh({4}), {Shard(0)});
    EXPECT_THAT(error_of([&] { dcp::load(state, dir); }), HasSubstr("missing from the checkpoint: ghost"));
    // non-strict: the rest loads, and both lists come back
    state.erase("w");
    ckpt::LoadOptions options;
    options.strict = false;
    const ckpt::LoadResult result = dcp::load(state, dir, options);
    EXPECT_EQ(result.missing, std::vector<std::string>{"ghost"});
    EXPECT_EQ(result.unexpected, std::vector<std::string>{"w"});
    EXPECT_TRUE(tensors_equal(full_tensor(state.at("bias")), dcp_expected_value("bias")));
  }
  {  // shape
    ckpt::State state = dcp_empty_state(names, DcpTarget::OneDimShard1);
    state["w"] = make_dtensor_holding(at::zeros({7, 6}), mesh({4}), {Shard(1)});
    EXPECT_THAT(error_of([&] { dcp::load(state, dir); }), HasSubstr("tensor 'w' has shape [7, 6] but"));
  }
  {  // a bytes entry named as a tensor
    ckpt::State state = dcp_empty_state(names, DcpTarget::OneDimShard1);
    state["step"] = make_dtensor_holding(at::zeros({4}), mesh({4}), {Shard(0)});
    EXPECT_THAT(error_of([&] { dcp::load(state, dir); }), HasSubstr("holds 'step' as bytes"));
  }
}

// A tensor of another dtype than the saved one gets the values converted, as PyTorch's dcp.load (copy_)
// converts them: float32 into float64 sharded, bfloat16 into float32 plain.
TEST_F(DcpLoadTest, ConvertsDtypesAsPyTorchsLoadDoes) {
  ckpt::State state;
  state["w"] = make_dtensor_holding(at::zeros({7, 5}, at::kDouble), mesh({4}), {Shard(1)});
  state["emb.weight"] = at::zeros({10, 3}, at::kFloat);
  ckpt::LoadOptions options;
  options.strict = false;
  dcp::load(state, dcp_written("dcp_sharded"), options);
  EXPECT_TRUE(tensors_equal(full_tensor(state.at("w")), dcp_expected_value("w").to(at::kDouble)));
  EXPECT_TRUE(tensors_equal(state.at("emb.weight"), dcp_expected_value("emb.weight").to(at::kFloat)));
}

// Each rank opens only the items its shards overlap: with w's chunk at [4, 3] (rows 4-6, columns 3-4)
// damaged, loading w as Shard(0) over 4 ranks (rows 0-1, 2-3, 4-5, 6) fails on ranks 2 and 3, which need
// it, with the item named; ranks 0 and 1 never read it and stop because rank 2 failed.
TEST_F(DcpLoadTest, ReadsOnlyTheItemsItsShardsOverlap) {
  namespace fs = std::filesystem;
  const int rank = world()->rank();
  const fs::path dir = fs::temp_directory_path() / ("dtensor_dcp_damaged_" + std::to_string(::getpid()) + "_" + std::to_string(rank));
  fs::remove_all(dir);
  fs::copy(dcp_written("dcp_sharded"), dir, fs::copy_options::recursive);
  const dcp::DcpMetadata md = dcp::read_metadata(dir.string());
  std::string damaged;
  for (const auto& [index, storage] : md.storage)
    if (index.fqn == "w" && index.offset == std::vector<int64_t>{4, 3}) {
      damaged = storage.relative_path;
      std::fstream f(dir / storage.relative_path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(storage.offset);
      const std::string zeros(static_cast<size_t>(storage.length), '\0');
      f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
    }
  ASSERT_FALSE(damaged.empty());
  ckpt::State state{{"w", make_dtensor_holding(at::zeros({7, 5}), mesh({4}), {Shard(0)})}};
  ckpt::LoadOptions options;
  options.strict = false;
  const std::string error = error_of([&] { dcp::load(state, dir.string(), options); });
  EXPECT_THAT(error, HasSubstr(damaged + ": bytes ["));
  EXPECT_THAT(error, HasSubstr("(item 'w' at [4, 3])"));
  if (rank < 2) {
    EXPECT_THAT(error, HasSubstr("failed on rank 2"));
  } else {
    EXPECT_THAT(error, ::testing::Not(HasSubstr("failed on rank")));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dtensor::testing
