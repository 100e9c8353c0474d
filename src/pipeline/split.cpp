#include <algorithm>
#include <sstream>

#include "dtensor/errors.h"
#include "dtensor/pipeline_split.h"

namespace dtensor::pipeline {
namespace {

std::string paths_of(const std::vector<ModelPiece>& pieces) {
  std::string out;
  for (size_t i = 0; i < pieces.size() && i < 12; ++i) out += (i ? ", " : "") + pieces[i].path;
  return pieces.size() > 12 ? out + ", ..." : out;
}

PipelineStage stage_of(int index, std::vector<ModelPiece> pieces) {
  PipelineStage stage{index, nullptr, {}, {}};
  for (const ModelPiece& piece : pieces) {
    stage.parameters.insert(stage.parameters.end(), piece.parameters.begin(), piece.parameters.end());
    for (const auto& module : piece.modules)  // each once: a root's pieces (embeddings, head) share it
      if (std::find(stage.modules.begin(), stage.modules.end(), module) == stage.modules.end()) stage.modules.push_back(module);
  }
  stage.forward = [pieces = std::move(pieces)](const at::Tensor& input) {
    at::Tensor x = input;
    for (const ModelPiece& piece : pieces) x = piece.forward(x);
    return x;
  };
  return stage;
}

std::string trimmed(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t"), end = text.find_last_not_of(" \t");
  return begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
}

}  // namespace

std::vector<PipelineStage> split_at(const std::vector<ModelPiece>& pieces, const std::vector<std::string>& split_points) {
  std::vector<size_t> cuts;
  for (const std::string& point : split_points) {
    const auto it = std::find_if(pieces.begin(), pieces.end(), [&](const ModelPiece& p) { return p.path == point; });
    if (it == pieces.end())
      throw DTensorError("pipeline split: the split point '" + point + "' names no piece of the model (its pieces: " + paths_of(pieces) + ")");
    const size_t at = static_cast<size_t>(it - pieces.begin());
    if (at == 0) throw DTensorError("pipeline split: the split point '" + point + "' is the model's first piece: the stage before it would be empty");
    if (!cuts.empty() && at <= cuts.back())
      throw DTensorError("pipeline split: the split point '" + point + "' comes " + (at == cuts.back() ? "twice" : "before the one given ahead of it") +
                         ": give split points in the order the model runs its pieces, each once");
    cuts.push_back(at);
  }
  cuts.push_back(pieces.size());
  std::vector<PipelineStage> stages;
  size_t begin = 0;
  for (const size_t end : cuts) {
    stages.push_back(stage_of(static_cast<int>(stages.size()), std::vector<ModelPiece>(pieces.begin() + begin, pieces.begin() + end)));
    begin = end;
  }
  return stages;
}

std::vector<std::string> even_split_points(const std::vector<ModelPiece>& pieces, const std::string& layers_prefix, int num_stages) {
  std::vector<std::string> paths;
  for (const ModelPiece& piece : pieces) paths.push_back(piece.path);
  return even_split_points(paths, layers_prefix, num_stages);
}

std::vector<std::string> even_split_points(const std::vector<std::string>& paths, const std::string& layers_prefix, int num_stages) {
  std::vector<std::string> layers;
  for (const std::string& path : paths)
    if (path.rfind(layers_prefix, 0) == 0) layers.push_back(path);
  if (num_stages < 1 || static_cast<int>(layers.size()) < num_stages)
    throw DTensorError("pipeline split: " + std::to_string(layers.size()) + " pieces start with '" + layers_prefix + "', too few for " +
                       std::to_string(num_stages) + " stages");
  std::vector<std::string> points;
  const size_t per_stage = layers.size() / num_stages, extra = layers.size() % num_stages;
  size_t at = 0;
  for (int s = 0; s + 1 < num_stages; ++s) {
    at += per_stage + (static_cast<size_t>(s) < extra ? 1 : 0);
    points.push_back(layers[at]);
  }
  return points;
}

std::vector<std::string> split_points_of(const std::string& stages) {
  std::vector<std::string> points;
  std::stringstream text(stages);
  std::string stage;
  long expected_first = 0;
  for (int index = 0; std::getline(text, stage, '|'); ++index) {
    const std::string range = trimmed(stage);
    const auto dot = range.rfind('.'), dash = range.find('-', dot == std::string::npos ? 0 : dot);
    long first = -1, last = -1;
    try {
      if (dot != std::string::npos && dash != std::string::npos) first = std::stol(range.substr(dot + 1, dash - dot - 1)), last = std::stol(range.substr(dash + 1));
    } catch (const std::exception&) {
    }
    if (first < 0 || last < first)
      throw DTensorError("pipeline split: stage " + std::to_string(index) + " is '" + range + "'; write each stage as a range of layers, e.g. 'layers.0-3 | layers.4-7'");
    if (first != expected_first)
      throw DTensorError("pipeline split: stage " + std::to_string(index) + " ('" + range + "') starts at layer " + std::to_string(first) + ", not at " +
                         std::to_string(expected_first) + " where the stage before it ends");
    if (index > 0) points.push_back(range.substr(0, dash));
    expected_first = last + 1;
  }
  return points;
}

}  // namespace dtensor::pipeline
