#pragma once
// The tensor-parallel styles and plans, shared by module-level parallelism (parallel.h, on torch::nn
// modules) and graph-level parallelism (graph/tensor_parallel.h, on exported programs). Plain data:
// no torch::nn headers.

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dtensor/placement.h"

namespace dtensor {

// Shards the output features. Linear: weight Shard(0), bias Shard(0). Embedding and EmbeddingBag:
// weight Shard(1) (the embedding dim). Conv1d/2d/3d: weight Shard(0), bias Shard(0) (the output
// channels). Forward wants a Replicate input; the output comes out sharded on its feature dim
// (Shard(-1); Shard(1), the channels, for convs). BatchNorm1d/2d/3d over the channels of a
// column-parallel conv: weight, bias and running statistics Shard(0); forward wants the input
// channel-sharded (Shard(1)) and normalises without communication; the output stays Shard(1).
struct ColwiseParallel {
  Placement input_layout = Replicate();
  std::optional<Placement> output_layout;  // default: the feature dim, Shard(-1) or Shard(1) (channels)
  bool use_local_output = true;
  // Graph level only: the output features are this many equal blocks fused into one layer (q, k and v;
  // gate and up), and each rank holds its part of every block (weight StridedShard(0, packed) for a
  // Linear), so that splitting the blocks apart needs no communication.
  int64_t packed = 1;
};

// Shards the input features. Linear: weight Shard(1), bias Replicate; forward wants a Shard(-1)
// input and its output is Partial, reduced to output_layout (Replicate: one all-reduce; Shard(1):
// one reduce-scatter). Conv1d/2d/3d alike over the input channels: weight Shard(1), bias Replicate
// (added once), forward wants a Shard(1) input. Embedding and EmbeddingBag: weight Shard(0) (the
// vocabulary, uneven allowed); forward wants Replicate token ids.
// EmbeddingBag (either style) reads every Tensor argument (indices, offsets, per-sample weights) as
// Replicate on the whole mesh: offsets point into the whole index list, so bags are not split over a
// data-parallel dim. Give it 1-d indices with offsets (2-d input makes its offsets inside forward, as
// a plain tensor).
struct RowwiseParallel {
  std::optional<Placement> input_layout;  // default: what forward wants (Shard(-1), Shard(1) or Replicate)
  Placement output_layout = Replicate();
  bool use_local_output = true;
};

// For norms and dropout over sequence-sharded activations: parameters Replicate; a plain input is read
// as Shard(sequence_dim).
struct SequenceParallel {
  int64_t sequence_dim = 1;
  bool use_local_output = false;
};

// Converts a module's Tensor arguments (by position; nullopt leaves one as it is): a plain argument is
// read as input_layouts[i] and redistributed to desired_input_layouts[i]. A plain argument read as a
// Shard is taken for an even shard (its global size: the local one times the mesh dim's size), as
// PyTorch's from_local without run_check takes it, since checking would cost a collective per call:
// pass uneven shards in as DTensors (from_local with run_check).
struct PrepareModuleInput {
  std::vector<std::optional<Placement>> input_layouts;
  std::vector<std::optional<Placement>> desired_input_layouts;
  bool use_local_output = false;
};

// Converts a module's Tensor result: a plain result is read as output_layout and redistributed to
// desired_output_layout.
struct PrepareModuleOutput {
  Placement output_layout = Replicate();
  Placement desired_output_layout = Replicate();
  bool use_local_output = true;
};

// Both at once on one module (PyTorch's PrepareModuleInputOutput, whose use_local_input is
// input.use_local_output here).
struct PrepareModuleInputOutput {
  PrepareModuleInput input;
  PrepareModuleOutput output;
};

// Expert parallelism (transformers' ep_dispatch_experts): a mixture-of-experts layer's experts spread
// over the plan's mesh dim, whole experts per rank (Shard(0) of its 3-d weights), each rank's tokens
// sent to them by all-to-all. Module level, on a dtensor::MoE block or its MoEExperts (moe.h); graph
// programs have no expert-parallel form yet.
struct ExpertParallel {};
using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput, PrepareModuleOutput,
                                   PrepareModuleInputOutput, ExpertParallel>;

// A submodule path ("" is the module itself); an atom between dots may use * and ? wildcards
// ("blocks.*.attn.wq"). Entries apply in order; each must match at least one submodule.
struct PlanEntry {
  std::string path;
  ParallelStyle style;
  // Skipped where it matches no module, instead of refused: transformers' plans are written once for
  // every config of a model type (Qwen3-MoE's names dense MLP layers that a config with mlp_only_layers
  // empty lacks), and transformers skips such entries. hugging_face_plan sets it.
  bool optional = false;
};
using ParallelizePlan = std::vector<PlanEntry>;

struct ParallelizeOptions {
  // The tensor-parallel mesh dim, by name; may stay empty on a 1-d mesh.
  std::string tp_dim;
};

// Whether a plan path pattern ("blocks.*.attn.w[qkv]": fnmatch wildcards per dot-separated atom)
// matches a module path ("blocks.0.attn.wq"): as many atoms, each matching.
bool path_matches(const std::string& pattern, const std::string& path);
std::vector<std::string> split_plan_path(const std::string& path);

}  // namespace dtensor
