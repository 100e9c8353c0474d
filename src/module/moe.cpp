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
#include "../sharding/kernels/grouped_experts.h"
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
    throw DTensorError("MoE router: hidden states are a DTensor; run the router through its MoE block, which routes each "
                       "rank's tokens");
  // A Replicate DTensor weight (distribute_module) routes this rank's tokens with its local copy; the
  // gradient those tokens give it is this rank's share, summed over the mesh by its gradient hook.
  const at::Tensor w = is_dtensor(weight) ? to_local(weight, Placements(static_cast<size_t>(mesh_of(weight)->ndim()), Partial()))
                                          : weight;
  return detail::route_from_logits(at::linear(hidden, w), options);
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

at::Tensor MoEExpertsImpl::local_experts(const at::Tensor& weight) const {
  if (!is_dtensor(weight)) {
    if (placement.mesh)
      throw DTensorError("MoE layer '" + path + "': expert_parallel made its experts DTensors, but one is a plain tensor now; "
                         "load weights into the DTensors (checkpoint::load) rather than replacing them");
    return weight;
  }
  if (!placement.mesh)
    throw DTensorError("MoE layer '" + path + "': its experts are DTensors but not spread by expert_parallel; call expert_parallel");
  // This rank's experts. Its tokens are its own (plain), so their gradients are partial sums over every
  // mesh dim but the ep dim, where each rank's experts are its Shard(0).
  Placements grad(static_cast<size_t>(placement.mesh->ndim()), Partial());
  grad[static_cast<size_t>(placement.dim)] = Shard(0);
  return to_local(weight, grad);
}

at::Tensor MoEExpertsImpl::forward(const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights) {
  if (is_dtensor(hidden))
    throw DTensorError("MoE layer '" + path + "': hidden states are a DTensor; give the experts this rank's tokens, or call the "
                       "MoE block, which takes DTensors");
  return detail::run_experts(hidden, experts, weights, local_experts(gate_up_proj), local_experts(down_proj), options.experts,
                             {placement.mesh, placement.dim}, path);
}

MoEImpl::MoEImpl(MoEOptions options) {
  gate = register_module("gate", MoERouter(options));
  experts = register_module("experts", MoEExperts(options));
}

namespace {

// Routing with the hidden states' leading dims (hidden [..., H], routing [tokens, .]), so that under
// expert parallelism it is sharded as they are (the flat tokens of uneven sequence shards are no
// torch.chunk shards).
Routing with_leading_dims(Routing routing, const at::Tensor& hidden) {
  auto leading = [&](const at::Tensor& t) {
    std::vector<int64_t> sizes(hidden.sizes().begin(), hidden.sizes().end() - 1);
    sizes.push_back(t.size(-1));
    return t.view(sizes);
  };
  routing.logits = leading(routing.logits);
  routing.experts = leading(routing.experts);
  routing.weights = leading(routing.weights);
  return routing;
}

at::Tensor as_tokens(const at::Tensor& hidden, int64_t size) { return hidden.reshape({hidden.numel() / size, size}); }  // -1 fails for 0 tokens

}  // namespace

MoEOutput MoEImpl::forward_with_routing(const at::Tensor& hidden) {
  const MoEOptions& options = experts->options;
  if (!hidden.defined() || hidden.dim() == 0 || hidden.size(-1) != options.hidden)
    throw DTensorError("MoE layer '" + experts->path + "': hidden states must end in the layer's hidden size " +
                       std::to_string(options.hidden) + (hidden.defined() ? " (got shape " + c10::str(hidden.sizes()) + ")" : ""));
  if (!is_dtensor(hidden)) {
    // This rank's tokens, its experts through their module (so that hooks on it, as fully_shard's, run).
    const at::Tensor tokens = as_tokens(hidden, options.hidden);
    const Routing routing = gate->forward(tokens);
    const at::Tensor out = call(experts, tokens, routing.experts, routing.weights);
    return {out.view(hidden.sizes()), with_leading_dims(routing, hidden)};
  }
  const ExpertPlacement& placement = experts->placement;
  if (!placement.mesh)
    throw DTensorError("MoE layer '" + experts->path + "': hidden states are a DTensor but the experts are not spread over a mesh "
                       "dim; call expert_parallel first");
  return forward_on_dtensor(hidden);
}

MoEOutput MoEImpl::forward_on_dtensor(const at::Tensor& hidden) {
  const MoEOptions& options = experts->options;
  const ExpertPlacement& placement = experts->placement;
  const Placements& laid = dtensor_impl(hidden).spec().placements;
  if (static_cast<int64_t>(laid.size()) != placement.mesh->ndim())
    throw DTensorError("MoE layer '" + experts->path + "': the hidden states lie on a mesh of " + std::to_string(laid.size()) +
                       " dims, its experts on one of " + std::to_string(placement.mesh->ndim()) + "; give it the experts' mesh");
  const auto [tokens, gate_grad, expert_grad] = expert_parallel_placements(laid, placement);
  // Each rank's tokens, routed and run there, on the local shards local_map hands over.
  int64_t dropped = 0;
  auto local = [&](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    const at::Tensor flat = as_tokens(in[0], options.hidden);
    const Routing routing = with_leading_dims(detail::route_from_logits(at::linear(flat, in[1]), options), in[0]);
    dropped = routing.dropped;
    const at::Tensor out = detail::run_experts(flat, routing.experts.reshape({flat.size(0), options.top_k}),
                                               routing.weights.reshape({flat.size(0), options.top_k}), in[2], in[3], options.experts,
                                               {placement.mesh, placement.dim}, experts->path);
    return {out.view(in[0].sizes()), routing.logits, routing.experts, routing.weights};
  };
  const DeviceMesh& mesh = *placement.mesh;
  const Placements& by_expert = placements_of(experts->gate_up_proj);  // as expert_parallel laid them out
  // A plain gate weight (kept in sync by the caller's data parallelism) passes as it is.
  const at::Tensor& gate_weight = gate->weight;
  const std::optional<Placements> gate_in = is_dtensor(gate_weight) ? std::optional(all(mesh, Replicate())) : std::nullopt;
  const std::optional<Placements> gate_grad_in = is_dtensor(gate_weight) ? std::optional(gate_grad) : std::nullopt;
  auto out = local_map(local, {tokens, tokens, tokens, tokens}, PlacementsPerInput{tokens, gate_in, by_expert, by_expert},
                       /*redistribute_inputs=*/true, placement.mesh,
                       PlacementsPerInput{tokens, gate_grad_in, expert_grad, expert_grad})(
      {hidden, gate_weight, experts->gate_up_proj, experts->down_proj});
  return {out[0], Routing{out[1], out[2], out[3], dropped}};
}

namespace {

// What transformers' loss multiplies, summed over `logits` [tokens, experts]' tokens: each expert's
// top-k assignments (no gradient) and router probability.
struct BalanceSums {
  at::Tensor assignments, probabilities;
};
BalanceSums balance_sums(const at::Tensor& logits, int64_t top_k) {
  const int64_t experts = logits.size(-1);
  const at::Tensor probabilities = at::softmax(logits, -1, detail::router_precision(logits));
  const at::Tensor chosen = std::get<1>(at::topk(probabilities, top_k, -1));
  return {at::one_hot(chosen.reshape(-1), experts).sum(0).to(probabilities.scalar_type()), probabilities.sum(0)};
}

at::Tensor balance_loss(const BalanceSums& sums, const at::Tensor& tokens) {
  return (sums.assignments / tokens * sums.probabilities / tokens).sum() * sums.probabilities.size(0);
}

}  // namespace

at::Tensor load_balancing_loss(const at::Tensor& router_logits, int64_t top_k) {
  const at::Tensor all_logits = is_dtensor(router_logits) ? full_tensor(router_logits) : router_logits;
  const at::Tensor logits = all_logits.reshape({-1, all_logits.size(-1)});
  const BalanceSums sums = balance_sums(logits, top_k);
  return balance_loss(sums, at::scalar_tensor(static_cast<double>(logits.size(0)), sums.probabilities.options()));
}

at::Tensor load_balancing_loss(const at::Tensor& router_logits, int64_t top_k, const MeshPtr& mesh) {
  if (is_dtensor(router_logits) || !mesh)
    throw DTensorError("load_balancing_loss over a mesh takes each rank's own router logits as a plain tensor, and a mesh; a "
                       "DTensor's logits already hold the whole batch: call load_balancing_loss(logits, top_k)");
  const at::Tensor logits = router_logits.reshape({-1, router_logits.size(-1)});
  BalanceSums sums = balance_sums(logits, top_k);
  const Placements partial(static_cast<size_t>(mesh->ndim()), Partial()), whole(static_cast<size_t>(mesh->ndim()), Replicate());
  const auto summed = [&](const at::Tensor& t) { return to_local(redistribute(from_local(t, mesh, partial), mesh, whole)); };
  const at::Tensor tokens = summed(at::scalar_tensor(static_cast<double>(logits.size(0)), sums.probabilities.options()));
  return balance_loss({summed(sums.assignments), summed(sums.probabilities)}, tokens);
}

void expert_parallel(MoEExpertsImpl& experts, const MeshPtr& mesh, int64_t ep_dim, const std::string& path) {
  if (!mesh || ep_dim < 0 || ep_dim >= mesh->ndim())
    throw DTensorError("expert_parallel('" + path + "'): mesh dim " + std::to_string(ep_dim) + " does not exist on this mesh");
  const int64_t count = experts.options.experts, ranks = mesh->size(ep_dim);
  if (count % ranks != 0)
    throw DTensorError("expert_parallel('" + path + "'): its " + std::to_string(count) + " experts do not divide over the " +
                       std::to_string(ranks) + " ranks of mesh dim " + std::to_string(ep_dim) +
                       "; expert parallelism gives every rank whole experts, as many on each");
  Placements by_expert = all(*mesh, Replicate());
  by_expert[static_cast<size_t>(ep_dim)] = Shard(0);
  distribute_parameter(experts, "gate_up_proj", mesh, by_expert, path + ".gate_up_proj");
  distribute_parameter(experts, "down_proj", mesh, by_expert, path + ".down_proj");
  experts.placement = {mesh, ep_dim};
  experts.path = path;
}

void expert_parallel(MoEImpl& moe, const MeshPtr& mesh, int64_t ep_dim, const std::string& path) {
  expert_parallel(*moe.experts, mesh, ep_dim, path + ".experts");
}

}  // namespace dtensor
