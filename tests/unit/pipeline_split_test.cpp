// A model split into pipeline stages at module paths (dtensor/pipeline_split.h): the stages, run one
// after another, compute what the whole model computes, and hold its parameters once each; bad split
// points are refused naming the point and the model's pieces.

#include <ATen/ATen.h>
#include <gmock/gmock.h>

#include "../support/error_of.h"
#include "dtensor/pipeline_split.h"

namespace dtensor::pipeline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using dtensor::testing::error_of;

// embed, layers.0 .. layers.<n-1>, norm: each piece scales and shifts by its own parameter.
std::vector<ModelPiece> llama_like_pieces(int layers) {
  std::vector<std::string> paths = {"embed_tokens"};
  for (int l = 0; l < layers; ++l) paths.push_back("layers." + std::to_string(l));
  paths.push_back("norm");
  std::vector<ModelPiece> pieces;
  for (size_t i = 0; i < paths.size(); ++i) {
    const at::Tensor p = at::full({3}, 1.0 + 0.1 * static_cast<double>(i), at::kDouble);
    pieces.push_back({paths[i], [p, i](const at::Tensor& x) { return at::tanh(x * p + static_cast<double>(i)); }, {p}});
  }
  return pieces;
}

at::Tensor run_stages(const std::vector<PipelineStage>& stages, at::Tensor x) {
  for (const PipelineStage& stage : stages) x = stage.forward(x);
  return x;
}

TEST(PipelineSplit, StagesComputeTheWholeModelAndHoldEachParameterOnce) {
  const auto pieces = llama_like_pieces(7);
  const at::Tensor x = at::linspace(-1, 1, 3, at::kDouble);
  const at::Tensor whole = run_stages(split_at(pieces, {}), x);
  at::Tensor expected = x;
  for (const ModelPiece& piece : pieces) expected = piece.forward(expected);
  EXPECT_TRUE(at::equal(whole, expected));

  const auto points = even_split_points(pieces, "layers.", 3);
  EXPECT_THAT(points, ElementsAre("layers.3", "layers.5"));  // 7 layers: 3, 2, 2; embed with the first, norm with the last
  const auto stages = split_at(pieces, points);
  ASSERT_EQ(stages.size(), 3u);
  EXPECT_TRUE(at::equal(run_stages(stages, x), expected));
  EXPECT_EQ(stages[0].parameters.size(), 4u);  // embed_tokens, layers.0-2
  EXPECT_EQ(stages[2].parameters.size(), 3u);  // layers.5-6, norm
  for (size_t s = 0; s < stages.size(); ++s) EXPECT_EQ(stages[s].index, static_cast<int>(s));
}

TEST(PipelineSplit, StagesWrittenAsRangesOfLayers) {
  EXPECT_THAT(split_points_of("layers.0-3 | layers.4-7"), ElementsAre("layers.4"));
  EXPECT_THAT(split_points_of("layers.0-1|layers.2-2 | layers.3-6"), ElementsAre("layers.2", "layers.3"));
  EXPECT_THAT(error_of([] { split_points_of("layers.0-3 | layers.5-7"); }), HasSubstr("starts at layer 5, not at 4 where the stage before it ends"));
  EXPECT_THAT(error_of([] { split_points_of("layers.0-3 | norm"); }), HasSubstr("stage 1 is 'norm'; write each stage as a range of layers"));
}

TEST(PipelineSplit, RefusesSplitPointsThatDoNotCutTheModel) {
  const auto pieces = llama_like_pieces(4);
  EXPECT_THAT(error_of([&] { split_at(pieces, {"layers.9"}); }),
              HasSubstr("the split point 'layers.9' names no piece of the model (its pieces: embed_tokens, layers.0, layers.1, layers.2, layers.3, norm)"));
  EXPECT_THAT(error_of([&] { split_at(pieces, {"embed_tokens"}); }), HasSubstr("is the model's first piece"));
  EXPECT_THAT(error_of([&] { split_at(pieces, {"layers.2", "layers.2"}); }), HasSubstr("'layers.2' comes twice"));
  EXPECT_THAT(error_of([&] { split_at(pieces, {"layers.2", "layers.1"}); }), HasSubstr("'layers.1' comes before the one given ahead of it"));
  EXPECT_THAT(error_of([&] { even_split_points(pieces, "layers.", 5); }), HasSubstr("4 pieces start with 'layers.', too few for 5 stages"));
}

}  // namespace
}  // namespace dtensor::pipeline
