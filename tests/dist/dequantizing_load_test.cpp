// LoadOptions::dequantize against PyTorch's QuantizedHuggingFaceStorageReader: an FP8 block-quantized
// checkpoint (scripts/write_quantized_checkpoint.py: weights whose shapes are not multiples of the
// 128 x 128 blocks) loaded onto plain tensors, a 1-d mesh of 4 (rows or columns, boxes that start inside
// a block) and a 2 x 2 mesh, each equal bit for bit to what PyTorch's reader loaded; and the checks
// that refuse what does not fit.

#include "../support/build_paths.h"
#include "dtensor/checkpoint.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

namespace ckpt = dtensor::checkpoint;
using ::testing::HasSubstr;

const std::string kQuantized = std::string(build_paths::checkpoint_interop) + "/quantized";

// The script's state: name -> (shape, dtype of the tensor it loads into).
const std::vector<std::tuple<std::string, Shape, at::ScalarType>> kQuantizedState = {
    {"layers.0.mlp.weight", {300, 200}, at::kFloat},
    {"head.weight", {100, 50}, at::kBFloat16},
    {"tiny.weight", {3, 200}, at::kFloat},  // Shard(0) over 4: one rank holds no row
    {"layers.0.mlp.bias", {300}, at::kFloat},
    {"norm.weight", {64}, at::kBFloat16}};

// What PyTorch's reader loaded (expected/model.safetensors), whole.
ckpt::State pytorch_dequantized() {
  ckpt::State expected;
  for (const auto& [name, shape, dtype] : kQuantizedState) expected[name] = at::zeros(shape, dtype);
  ckpt::LoadOptions options;
  options.world = world();
  ckpt::load(expected, kQuantized + "/expected", options);
  return expected;
}

class DequantizingLoadTest : public DistTest {};

TEST_F(DequantizingLoadTest, LoadsWhatPyTorchsQuantizedReaderLoadsOnAnyLayout) {
  const ckpt::State expected = pytorch_dequantized();
  const std::vector<std::pair<MeshPtr, Placements>> layouts = {
      {nullptr, {}}, {mesh({4}), {Shard(0)}}, {mesh({4}), {Shard(1)}}, {mesh({2, 2}), {Shard(1), Shard(0)}}};
  for (const auto& [m, placements] : layouts) {
    SCOPED_TRACE(m ? m->str() + " " + to_string(placements) : "plain");
    ckpt::State state;
    for (const auto& [name, shape, dtype] : kQuantizedState) {
      const at::Tensor zeros = at::zeros(shape, dtype);
      // 1-d tensors take Shard(0) on every mesh dim.
      state[name] = !m ? zeros : make_dtensor_holding(zeros, m, shape.size() == 2 ? placements : Placements(m->ndim(), Shard(0)));
    }
    ckpt::LoadOptions options;
    options.world = world();
    options.dequantize = ckpt::DequantizeOptions{};
    options.strict = false;  // the MXFP4 pair is not asked for: listed, not refused
    const ckpt::LoadResult result = ckpt::load(state, kQuantized + "/checkpoint", options);
    EXPECT_TRUE(result.missing.empty());
    EXPECT_EQ(result.unexpected, (std::vector<std::string>{"experts.w_blocks", "experts.w_scales"}));
    for (const auto& [name, shape, dtype] : kQuantizedState) {
      const at::Tensor& t = state.at(name);
      EXPECT_TRUE(tensors_equal(is_dtensor(t) ? full_tensor(t) : t, expected.at(name))) << name;
    }
  }
}

TEST_F(DequantizingLoadTest, RefusesWhatDoesNotFit) {
  ckpt::State state;
  for (const auto& [name, shape, dtype] : kQuantizedState) state[name] = at::zeros(shape, dtype);
  ckpt::LoadOptions options;
  options.world = world();
  options.strict = false;
  // Without dequantize the float8 weights are not the state's dtype.
  EXPECT_THAT(error_of([&] { ckpt::load(state, kQuantized + "/checkpoint", options); }), HasSubstr("as Float8_e4m3fn"));
  options.dequantize = ckpt::DequantizeOptions{.block_size = 0};
  EXPECT_THAT(error_of([&] { ckpt::load(state, kQuantized + "/checkpoint", options); }), HasSubstr("block_size must be in [1, 2^31], not 0"));
  options.dequantize = ckpt::DequantizeOptions{.block_size = 64};
  EXPECT_THAT(error_of([&] { ckpt::load(state, kQuantized + "/checkpoint", options); }),
              HasSubstr("in blocks of 64 needs [2, 1]; is block_size the checkpoint's?"));
  options.dequantize = ckpt::DequantizeOptions{};
  state["head.weight"] = at::zeros({100, 50}, at::kInt);
  EXPECT_THAT(error_of([&] { ckpt::load(state, kQuantized + "/checkpoint", options); }),
              HasSubstr("the state tensor 'head.weight' is Int; dequantized values need a floating dtype"));
  state["head.weight"] = at::zeros({50, 100}, at::kFloat);
  EXPECT_THAT(error_of([&] { ckpt::load(state, kQuantized + "/checkpoint", options); }),
              HasSubstr("'head.weight' is stored with shape [100, 50] for a state tensor of shape [50, 100]"));
  state["head.weight"] = at::zeros({100, 50}, at::kFloat);
  state["experts.w_blocks"] = at::zeros({2, 4, 16}, at::kByte);
  EXPECT_THAT(error_of([&] { ckpt::load(state, kQuantized + "/checkpoint", options); }),
              HasSubstr("'experts.w_blocks' with 'experts.w_scales' is an MXFP4 tensor"));
}

}  // namespace
}  // namespace dtensor::testing
