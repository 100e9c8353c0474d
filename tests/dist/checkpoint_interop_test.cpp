// Checkpoints across the ecosystem: dtensor loads what PyTorch wrote (scripts/write_pytorch_checkpoints.py:
// safetensors' save_file, a Hugging Face index over two files, DCP's HuggingFaceStorageWriter whole and
// sharded from 2 ranks) into a tensor-parallel state, each rank reading only its slice; and writes one
// from sharded layouts (shards, and whole tensors) that scripts/check_dtensor_checkpoint.py (ctest
// checkpoint_read_by_pytorch) reads with the safetensors library and DCP.

#include <filesystem>

#include "dtensor/checkpoint.h"
#include "dtensor/dcp.h"
#include "../support/build_paths.h"
#include "../support/test_models.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;

const fs::path kInterop = build_paths::checkpoint_interop;

struct InteropTensor {
  std::string name;
  Shape shape;
  at::ScalarType dtype;
};

// scripts/checkpoint_values.py's TENSORS, in its order.
const std::vector<InteropTensor> kTensors = {{"tok_emb.weight", {13, 8}, at::kFloat},
                                             {"blocks.0.fc1.weight", {10, 8}, at::kBFloat16},
                                             {"blocks.0.fc1.bias", {10}, at::kFloat},
                                             {"lm_head.weight", {13, 8}, at::kFloat},
                                             {"counter", {}, at::kLong}};

// scripts/checkpoint_values.py's value(), computed here on its own.
at::Tensor interop_value(size_t index, const InteropTensor& t) {
  at::Tensor x = at::arange(numel(t.shape), at::kDouble).remainder(97).sub(48).mul(0.25).add(static_cast<double>(index));
  if (t.dtype == at::kLong) x = x.mul(4);
  return x.reshape(t.shape).to(t.dtype);
}

// Megatron's placements over a 1-d TP mesh (uneven: 13 and 10 rows over 4 ranks), or DP x TP.
Placements placements_for(const std::string& name, const MeshPtr& mesh) {
  const Placement tp = name == "lm_head.weight" ? Shard(1) : Shard(0);
  if (mesh->ndim() == 1) return {tp};
  return {Replicate(), tp};
}

ckpt::State tensor_parallel_state(const MeshPtr& mesh, bool values) {
  ckpt::State state;
  for (size_t i = 0; i < kTensors.size(); ++i) {
    const InteropTensor& t = kTensors[i];
    const at::Tensor whole = values ? interop_value(i, t) : at::zeros(t.shape, t.dtype);
    state[t.name] = t.shape.empty() ? whole : make_dtensor_holding(whole, mesh, placements_for(t.name, mesh));
  }
  return state;
}

class CheckpointInteropTest : public DistTest {};

TEST_F(CheckpointInteropTest, LoadsWhatPyTorchWroteReadingOnlyEachRanksSlice) {
  for (const MeshPtr& m : {mesh({4}), mesh({2, 2})}) {
    for (const char* writer : {"save_file", "hf_index", "dcp_whole", "dcp_sharded"}) {
      SCOPED_TRACE(std::string(writer) + " into " + m->str());
      ckpt::State state = tensor_parallel_state(m, false);
      const ckpt::LoadResult result = ckpt::load(state, (kInterop / "pytorch_written" / writer).string());
      int64_t own_bytes = 0;
      for (size_t i = 0; i < kTensors.size(); ++i) {
        const at::Tensor& t = state.at(kTensors[i].name);
        const at::Tensor expected = interop_value(i, kTensors[i]);
        if (!is_dtensor(t)) {
          EXPECT_TRUE(tensors_equal(t, expected)) << kTensors[i].name;
          own_bytes += t.numel() * static_cast<int64_t>(t.element_size());
          continue;
        }
        const at::Tensor& local = local_tensor_of(t);
        EXPECT_TRUE(tensors_equal(local, expected_shard(expected, m, placements_of(t)))) << kTensors[i].name;
        own_bytes += local.numel() * static_cast<int64_t>(local.element_size());
      }
      EXPECT_EQ(result.bytes_read, own_bytes);
    }
  }
}

TEST_F(CheckpointInteropTest, WritesWhatPyTorchReads) {
  // Read back by ctest checkpoint_read_by_pytorch. DP2 x TP2: replicas over dp are written once.
  // Also as whole tensors (dtensor_written_whole): ordinary Hugging Face shards.
  for (const bool whole : {false, true}) {
    const fs::path written = test_output_dir(kInterop) / (whole ? "dtensor_written_whole" : "dtensor_written");
    const std::string dir = written.string();
    ckpt::save(tensor_parallel_state(mesh({2, 2}), true), dir, {.overwrite = true, .whole_tensors = whole});
    ckpt::State back = tensor_parallel_state(mesh({4}), false);
    ckpt::load(back, dir);
    for (size_t i = 0; i < kTensors.size(); ++i) {
      const at::Tensor& t = back.at(kTensors[i].name);
      EXPECT_TRUE(tensors_equal(is_dtensor(t) ? full_tensor(t) : t, interop_value(i, kTensors[i])));
    }
  }
}

// PyTorch's own DCP format from DP2 x TP2 (uneven shards, replicas written once, a plain 0-d tensor):
// read back by ctest checkpoint_read_by_pytorch with torch.distributed.checkpoint.load, and here by
// dtensor's metadata reader, whose checks (chunks tiling every tensor, storage for every chunk) it passes.
TEST_F(CheckpointInteropTest, WritesPyTorchsDcpFormat) {
  const std::string dir = (test_output_dir(kInterop) / "dtensor_written_dcp").string();
  ckpt::dcp::save(tensor_parallel_state(mesh({2, 2}), true), dir);
  const ckpt::dcp::DcpMetadata metadata = ckpt::dcp::read_metadata(dir);
  ASSERT_EQ(metadata.entries.size(), kTensors.size());
  for (const InteropTensor& t : kTensors) {
    const auto& tensor = std::get<ckpt::dcp::DcpTensor>(metadata.entries.at(t.name));
    EXPECT_EQ(tensor.size, t.shape) << t.name;
    EXPECT_EQ(tensor.dtype, t.dtype) << t.name;
  }
  // lm_head.weight, Shard(1) over tp: 8 columns in 2 chunks, each written once though dp holds it twice.
  EXPECT_EQ(std::get<ckpt::dcp::DcpTensor>(metadata.entries.at("lm_head.weight")).chunks.size(), 2u);
  // And dtensor's DCP loader takes it onto another layout.
  ckpt::State back = tensor_parallel_state(mesh({4}), false);
  ckpt::dcp::load(back, dir);
  for (size_t i = 0; i < kTensors.size(); ++i) {
    const at::Tensor& t = back.at(kTensors[i].name);
    EXPECT_TRUE(tensors_equal(is_dtensor(t) ? full_tensor(t) : t, interop_value(i, kTensors[i]))) << kTensors[i].name;
  }
}

}  // namespace
}  // namespace dtensor::testing
