#pragma once
// A model split into pipeline stages (dtensor/pipeline.h) at module paths, as torchtitan's
// pipeline_parallel_split_points and Hugging Face's base_model_pp_plan split one: the model is its
// pieces in the order its forward runs them (embed_tokens, layers.0, ..., layers.N-1, norm, lm_head),
// each taking the previous one's output, and a stage is a run of consecutive pieces.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/pipeline.h"

namespace dtensor::pipeline {

// One piece of a model: a module path, what it computes, its parameters, and the modules holding them
// (PipelineStage::modules).
struct ModelPiece {
  std::string path;
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<at::Tensor> parameters;
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
};

// The stages of `pieces` cut before each piece named in `split_points` (in the pieces' order; a
// stage per split point plus one), each stage's forward running its pieces in order. Refuses a split
// point that names no piece (listing the paths), one given twice, out of order, or at the first
// piece (an empty stage).
std::vector<PipelineStage> split_at(const std::vector<ModelPiece>& pieces, const std::vector<std::string>& split_points);

// Split points that spread the pieces whose path starts with `layers_prefix` ("layers.") over
// `num_stages` stages as evenly as they go (the first stages take one more where they do not divide),
// the pieces before them joining the first stage and those after the last: base_model_pp_plan's
// `layers` split evenly.
std::vector<std::string> even_split_points(const std::vector<ModelPiece>& pieces, const std::string& layers_prefix, int num_stages);
// The same over the pieces' paths alone, in forward order.
std::vector<std::string> even_split_points(const std::vector<std::string>& paths, const std::string& layers_prefix, int num_stages);

// Split points from stages written as ranges of layers, "layers.0-3 | layers.4-7": each stage after
// the first starts at its first layer. Refuses text of another form, and ranges that do not follow one
// another.
std::vector<std::string> split_points_of(const std::string& stages);

}  // namespace dtensor::pipeline
