// The MoE modules, their expert parallelism and transformers' load-balancing loss.

#include "dtensor/moe.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <cmath>

#include "dtensor/api.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"
#include "dtensor/local_map.h"
#include "dtensor/module.h"
#include "moe_kernels.h"

namespace dtensor {
namespace {

void check_options(const MoEOptions& o) {
  const std::string what = "MoEOptions: ";
  if (o.hidden <= 0 || o.intermediate <= 0 || o.experts <= 0)
    throw DTensorError(what + "hidden, intermediate and experts must be positive (got " + std::to_string(o.hidden) + ", " +
                       std::to_string(o.intermediate) + ", " + std::to_string(o.experts) + ")");
  if (o.top_k < 1 || o.top_k > o.experts)
    throw DTensorError(what + "top_k " + std::to_string(o.top_k) + " must be in [1, experts = " + std::to_string(o.experts) + "]");
  if (o.capacity_factor && !(*o.capacity_factor > 0))
    throw DTensorError(what + "a capacity factor of " + std::to_string(*o.capacity_factor) +
                       " gives every expert a capacity of 0; give a positive factor, or none for dropless routing");
}

const bool moe_members_registered = [] {
  register_tensor_members<MoERouterImpl>({{"weight", &MoERouterImpl::weight}});
  register_tensor_members<MoEExpertsImpl>({{"gate_up_proj", &MoEExpertsImpl::gate_up_proj}, {"down_proj", &MoEExpertsImpl::down_proj}});
  return true;
}();

// Kaiming-uniform over each expert's input features, as torch::nn::Linear initialises its weight.
void init_linear_like(at::Tensor& weight) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(weight.size(-1)));
  torch::NoGradGuard no_grad;
  weight.uniform_(-bound, bound);
}

Placements all(const DeviceMesh& mesh, const Placement& p) { return Placements(static_cast<size_t>(mesh.ndim()), p); }

// Under expert parallelism: how the block's tokens lie (Shard(0) over the ep dim; over the other dims
// as the hidden states are, sharded on their tokens as data parallelism shards a batch, or
// replicated), and so how the gradients the local computation gives the gate and the experts lie:
// each token-sharded dim makes them partial sums there (the ep dim's own share of the experts is
// their Shard(0)).
struct EpPlacements {
  Placements tokens, gate_grad, expert_grad;
};
EpPlacements expert_parallel_placements(const Placements& hidden, const ExpertPlacement& ep) {
  EpPlacements p{hidden, Placements(hidden.size(), Replicate()), Placements(hidden.size(), Replicate())};
  for (size_t d = 0; d < hidden.size(); ++d) {
    if (static_cast<int64_t>(d) == ep.dim) {
      p.tokens[d] = Shard(0);
      p.gate_grad[d] = Partial();
      p.expert_grad[d] = Shard(0);
    } else if (hidden[d].is_shard(0)) {
      p.gate_grad[d] = Partial();
      p.expert_grad[d] = Partial();
    } else {
      p.tokens[d] = Replicate();
    }
  }
  return p;
}

}  // namespace

MoERouterImpl::MoERouterImpl(MoEOptions options_) : options(std::move(options_)) {
  check_options(options);
  weight = register_parameter("weight", at::empty({options.experts, options.hidden}));
  reset_parameters();
}

void MoERouterImpl::reset_parameters() { init_linear_like(weight); }

Routing MoERouterImpl::forward(const at::Tensor& hidden) {
  if (is_dtensor(hidden))
    throw DTensorError("MoE router: hidden states are a DTensor; run the router through its MoE block (expert_parallel), "
                       "which routes each rank's tokens");
  return detail::route_from_logits(at::linear(hidden, weight), options);
}

MoEExpertsImpl::MoEExpertsImpl(MoEOptions options_) : options(std::move(options_)) {
  check_options(options);
  gate_up_proj = register_parameter("gate_up_proj", at::empty({options.experts, 2 * options.intermediate, options.hidden}));
  down_proj = register_parameter("down_proj", at::empty({options.experts, options.hidden, options.intermediate}));
  reset_parameters();
}

void MoEExpertsImpl::reset_parameters() {
  init_linear_like(gate_up_proj);
  init_linear_like(down_proj);
}

at::Tensor MoEExpertsImpl::forward(const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights) {
  if (is_dtensor(gate_up_proj) || is_dtensor(hidden))
    throw DTensorError("MoE layer '" + path + "': its experts or hidden states are DTensors; run it through its MoE block, "
                       "whose forward dispatches each rank's tokens");
  return detail::run_experts(hidden, experts, weights, gate_up_proj, down_proj, options, placement, path);
}

MoEImpl::MoEImpl(MoEOptions options) {
  gate = register_module("gate", MoERouter(options));
  experts = register_module("experts", MoEExperts(options));
}

MoEOutput MoEImpl::forward_with_routing(const at::Tensor& hidden) {
  const MoEOptions& options = experts->options;
  const ExpertPlacement& placement = experts->placement;
  if (!hidden.defined() || hidden.dim() == 0 || hidden.size(-1) != options.hidden)
    throw DTensorError("MoE layer '" + experts->path + "': hidden states must end in the layer's hidden size " +
                       std::to_string(options.hidden) + (hidden.defined() ? " (got shape " + c10::str(hidden.sizes()) + ")" : ""));
  // Each rank's tokens, routed and run there: the same function for one process and under expert
  // parallelism, where local_map hands it the local shards.
  Routing routing;
  auto local = [&](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    const at::Tensor tokens = in[0].reshape({in[0].numel() / options.hidden, options.hidden});  // -1 fails for 0 tokens
    routing = detail::route_from_logits(at::linear(tokens, in[1]), options);
    const at::Tensor out = detail::run_experts(tokens, routing.experts, routing.weights, in[2], in[3], options, placement,
                                               experts->path);
    // Routing keeps the hidden states' leading dims, so that under expert parallelism it is sharded as
    // they are (the flat tokens of uneven sequence shards are no torch.chunk shards).
    auto leading = [&](const at::Tensor& t) {
      std::vector<int64_t> sizes(in[0].sizes().begin(), in[0].sizes().end() - 1);
      sizes.push_back(t.size(-1));
      return t.view(sizes);
    };
    routing.logits = leading(routing.logits);
    routing.experts = leading(routing.experts);
    routing.weights = leading(routing.weights);
    return {out.view(in[0].sizes()), routing.logits, routing.experts, routing.weights};
  };
  const std::vector<at::Tensor> inputs{hidden, gate->weight, experts->gate_up_proj, experts->down_proj};
  if (!placement.mesh) {
    auto out = local(inputs);
    return {out[0], routing};
  }
  if (!is_dtensor(hidden))
    throw DTensorError("MoE layer '" + experts->path + "': under expert parallelism over mesh dim " + std::to_string(placement.dim) +
                       " the hidden states must be a DTensor with its tokens (dim 0) sharded over that dim");
  const Placements& laid = dtensor_impl(hidden).spec().placements;
  if (static_cast<int64_t>(laid.size()) != placement.mesh->ndim())
    throw DTensorError("MoE layer '" + experts->path + "': the hidden states lie on a mesh of " + std::to_string(laid.size()) +
                       " dims, its experts on one of " + std::to_string(placement.mesh->ndim()) + "; give it the experts' mesh");
  const auto [tokens, gate_grad, expert_grad] = expert_parallel_placements(laid, placement);
  const DeviceMesh& mesh = *placement.mesh;
  Placements by_expert = all(mesh, Replicate());
  by_expert[static_cast<size_t>(placement.dim)] = Shard(0);
  auto out = local_map(local, {tokens, tokens, tokens, tokens}, PlacementsPerInput{tokens, all(mesh, Replicate()), by_expert, by_expert},
                       /*redistribute_inputs=*/true, placement.mesh,
                       PlacementsPerInput{tokens, gate_grad, expert_grad, expert_grad})(inputs);
  return {out[0], Routing{out[1], out[2], out[3], routing.dropped}};
}

at::Tensor load_balancing_loss(const at::Tensor& router_logits, int64_t top_k) {
  const at::Tensor all_logits = is_dtensor(router_logits) ? full_tensor(router_logits) : router_logits;
  const int64_t experts = all_logits.size(-1);
  const at::Tensor logits = all_logits.reshape({-1, experts});
  const at::Tensor probabilities = at::softmax(logits, -1, detail::router_precision(logits));
  const at::Tensor chosen = std::get<1>(at::topk(probabilities, top_k, -1));
  const double tokens = static_cast<double>(logits.size(0));
  const at::Tensor share = at::one_hot(chosen.reshape(-1), experts).sum(0).to(probabilities.scalar_type()) / tokens;
  return (share * probabilities.sum(0) / tokens).sum() * experts;
}

void expert_parallel(MoEImpl& moe, const MeshPtr& mesh, int64_t ep_dim, const std::string& path) {
  if (!mesh || ep_dim < 0 || ep_dim >= mesh->ndim())
    throw DTensorError("expert_parallel('" + path + "'): mesh dim " + std::to_string(ep_dim) + " does not exist on this mesh");
  const int64_t experts = moe.experts->options.experts, ranks = mesh->size(ep_dim);
  if (experts % ranks != 0)
    throw DTensorError("expert_parallel('" + path + "'): its " + std::to_string(experts) + " experts do not divide over the " +
                       std::to_string(ranks) + " ranks of mesh dim " + std::to_string(ep_dim) +
                       "; expert parallelism gives every rank whole experts, as many on each");
  Placements by_expert = all(*mesh, Replicate());
  by_expert[static_cast<size_t>(ep_dim)] = Shard(0);
  distribute_parameter(*moe.experts, "gate_up_proj", mesh, by_expert, path + ".experts.gate_up_proj");
  distribute_parameter(*moe.experts, "down_proj", mesh, by_expert, path + ".experts.down_proj");
  distribute_parameter(*moe.gate, "weight", mesh, all(*mesh, Replicate()), path + ".gate.weight");
  moe.experts->placement = {mesh, ep_dim};
  moe.experts->path = path + ".experts";
}

}  // namespace dtensor
