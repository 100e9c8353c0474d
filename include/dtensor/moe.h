#pragma once
// A mixture-of-experts layer for torch::nn models, laid out as transformers' Qwen3-MoE and Mixtral
// blocks (`gate.weight` [experts, hidden]; `experts.gate_up_proj` [experts, 2 x intermediate, hidden]
// and `experts.down_proj` [experts, hidden, intermediate], each expert a SwiGLU MLP), so that their
// state dicts load as they are; and expert parallelism over one mesh dim (torchtitan's "ep"): each
// rank holds whole experts (Shard(0) of the expert weights), its tokens travel to their experts' ranks
// by an uneven all-to-all (dtensor/all_to_all.h) and back by another, and the local experts run as
// one grouped matrix multiply.
//
// Routing (MoERouterImpl): a linear gate scores every token for every expert; the top-k experts are
// taken after a softmax (Qwen3-MoE and Mixtral; the k weights optionally renormalised to sum to 1)
// or before it (the softmax over the k logits only, as DeepSeek-V2 and Switch-style routers do).
// Dropless by default: every token reaches its k experts. With a capacity factor, each expert takes at
// most ceil(factor x tokens x k / experts) assignments of a token group, GShard's way: first choices
// before second ones, and within a choice in token order; the rest are dropped (they add nothing to
// the output) and counted. A token group is what one forward call gives the layer on one rank: under
// expert parallelism, each rank's tokens.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "dtensor/device_mesh.h"

namespace dtensor {

enum class RouterScores {
  SoftmaxThenTopK,  // Qwen3-MoE, Mixtral: the k largest of the softmax over all experts
  TopKThenSoftmax,  // the softmax over the k largest logits
};

struct MoEOptions {
  int64_t hidden = 0;
  int64_t intermediate = 0;  // each expert's (transformers' moe_intermediate_size)
  int64_t experts = 0;
  int64_t top_k = 1;
  RouterScores scores = RouterScores::SoftmaxThenTopK;
  bool normalize_top_k = false;  // transformers' norm_topk_prob (Mixtral: true)
  std::optional<double> capacity_factor;  // none: dropless
};

// Which experts each token goes to, with what weight. The tensors have the hidden states' leading dims
// ([batch, sequence, ...] or [tokens, ...]): a DTensor's are sharded as the hidden states are.
struct Routing {
  at::Tensor logits;   // [..., experts], the gate's output (for the load-balancing loss)
  at::Tensor experts;  // [..., k] int64: chosen experts, best first; `dropped_expert` where dropped
  at::Tensor weights;  // [..., k]: their weights (0 where dropped), in the input's dtype
  int64_t dropped = 0;  // this rank's assignments dropped by the capacity (0 when dropless)
};

// Marks a dropped assignment in Routing::experts (transformers' experts skip this index as well).
inline int64_t dropped_expert(const MoEOptions& options) { return options.experts; }

class MoERouterImpl : public torch::nn::Module {
 public:
  explicit MoERouterImpl(MoEOptions options);
  // `hidden` [tokens, hidden] (plain or a DTensor sharded on its tokens; the routing after the gate
  // runs on each rank's tokens).
  Routing forward(const at::Tensor& hidden);
  void reset_parameters();
  at::Tensor weight;  // [experts, hidden]
  MoEOptions options;
};
TORCH_MODULE(MoERouter);

// Where the experts live: all on this rank, or spread over a mesh dim (expert_parallel).
struct ExpertPlacement {
  MeshPtr mesh;     // null: every expert local
  int64_t dim = 0;  // the ep dim of `mesh`
};

class MoEExpertsImpl : public torch::nn::Module {
 public:
  explicit MoEExpertsImpl(MoEOptions options);
  // transformers' experts forward: `hidden` [tokens, hidden] (plain: this rank's tokens) and its
  // routing [tokens, k] -> the weighted sum of each token's experts' outputs, [tokens, hidden]. Under
  // expert parallelism every rank of the ep dim calls it (with its own tokens, any number, zero
  // included); the gradients of this rank's experts are then the sums over the tokens of its ep
  // group, partial over the mesh's other dims (whose data parallelism reduces them: with fully_shard
  // over them, set its gradient divide factor to the whole data-parallel world, as torchtitan does).
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights);
  void reset_parameters();
  at::Tensor gate_up_proj;  // [experts, 2 x intermediate, hidden]: gate rows first, then up rows
  at::Tensor down_proj;     // [experts, hidden, intermediate]
  MoEOptions options;
  ExpertPlacement placement;
  std::string path = "experts";  // names the layer in errors (expert_parallel sets the module path)

 private:
  // This rank's experts of `weight` (the parameter itself unless expert parallel).
  at::Tensor local_experts(const at::Tensor& weight) const;
};
TORCH_MODULE(MoEExperts);

struct MoEOutput {
  at::Tensor output;  // like the input
  Routing routing;
};

// transformers' sparse MoE block: router, then experts, on hidden states [..., hidden]:
//  - plain: this rank's tokens (one process, or each rank its own rows under data parallelism, as
//    torchtitan runs EP inside FSDP's data-parallel ranks), the experts called through their module;
//  - a DTensor on the experts' mesh (expert_parallel), its tokens (dim 0) sharded over the ep dim and
//    sharded on dim 0 or replicated over the other dims: the output and the routing are DTensors laid
//    out alike, and the gradients are reduced where the placements say (a gate weight made a Replicate
//    DTensor by distribute_module gets its sum over the token-sharded dims).
class MoEImpl : public torch::nn::Module {
 public:
  explicit MoEImpl(MoEOptions options);
  at::Tensor forward(const at::Tensor& hidden) { return forward_with_routing(hidden).output; }
  MoEOutput forward_with_routing(const at::Tensor& hidden);
  MoERouter gate{nullptr};
  MoEExperts experts{nullptr};

 private:
  MoEOutput forward_on_dtensor(const at::Tensor& hidden);
};
TORCH_MODULE(MoE);

// transformers' load_balancing_loss_func for one layer: experts x the sum over experts of (the share
// of top-k assignments it got) x (its mean router probability), over the tokens of `router_logits`
// [..., experts] (a DTensor's whole tokens: the loss of one process on the whole batch). Only the
// probabilities carry gradient.
at::Tensor load_balancing_loss(const at::Tensor& router_logits, int64_t top_k);
// The same loss over the tokens of every rank of `mesh`, from each rank's own plain `router_logits`
// (any number of tokens, zero included): the assignments, probabilities and token counts are summed
// over the mesh before their product, as Megatron's global auxiliary loss does, so every rank gets the
// loss of one process on the whole batch, and its logits their share of its gradient. Every rank of
// the mesh calls it. Under data parallelism that averages gradients over n ranks, each rank's backward
// of this one loss gives 1/n of its gradient: scale it by n.
at::Tensor load_balancing_loss(const at::Tensor& router_logits, int64_t top_k, const MeshPtr& mesh);

// Expert parallelism for `moe` over `mesh`'s dim `ep_dim`: the expert weights become DTensors
// Shard(0) over it (experts [r x E/n, (r+1) x E/n) on coordinate r; Replicate over the mesh's other
// dims), and the block dispatches tokens to them (see MoEImpl). The gate's weight is left as it is,
// like the model's other dense parameters (data parallelism, fully_shard or distribute_module, keeps
// it in sync). Throws naming the layer and the dim when the experts do not divide by the dim's size.
void expert_parallel(MoEImpl& moe, const MeshPtr& mesh, int64_t ep_dim, const std::string& path = "moe");
// The same for the experts alone (the module transformers' ep_dispatch_experts names).
void expert_parallel(MoEExpertsImpl& experts, const MeshPtr& mesh, int64_t ep_dim, const std::string& path = "experts");

}  // namespace dtensor
