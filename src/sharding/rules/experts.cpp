// The experts of a mixture of experts as ops, and how they shard: dtensor::moe_experts(hidden [tokens,
// hidden], experts [tokens, k], weights [tokens, k], gate_up [E, 2I, hidden], down [E, hidden, I]) is
// transformers' experts forward (grouped_experts.h), and dtensor::moe_experts_backward(grad, the same
// five) its gradients for hidden, weights, gate_up and down. Graph programs get them where their
// exported experts ran (src/graph/experts_fusion.cpp), so that expert parallelism is a choice of
// strategy. Along one mesh dim:
//  - everything Replicate;
//  - tokens Shard(0) and the experts' weights Replicate: data parallel (weights' gradients Partial);
//  - tokens Replicate and the weights Shard(0), uneven E allowed: each rank runs the assignments to its
//    own experts and the outputs add up (Partial), as transformers' expert parallelism does;
//  - tokens and weights Shard(0): tokens travel to their experts' ranks and back by all-to-all
//    (torchtitan's expert parallelism), E divisible by the dim's size;
//  - (backward) the gradient Partial, the rest Replicate: every gradient is linear in it.
// At most one mesh dim spreads the experts. The backward recomputes the forward (its dispatch
// included) and differentiates it: one more exchange and expert pass instead of saving
// data-dependent shapes in the program.

#include <ATen/ATen.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "../kernels/grouped_experts.h"
#include "../propagation.h"
#include "../registry.h"
#include "rule_helpers.h"
#include "vocab_rows.h"

namespace dtensor::rules {
namespace {

constexpr const char* kForwardOp = "dtensor::moe_experts";
constexpr const char* kBackwardOp = "dtensor::moe_experts_backward";

using Gradients = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The gradients of run_experts for hidden, weights, gate_up and down, by recording it with autograd
// (also where the caller runs below autograd, as graph programs do) and differentiating it.
Gradients experts_gradients(const at::Tensor& grad, const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights,
                            const at::Tensor& gate_up, const at::Tensor& down, int64_t num_experts, const detail::ExpertsSpread& spread,
                            const std::string& path) {
  const c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  c10::impl::ForceDispatchKeyGuard with_autograd(keys.included_, keys.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  at::AutoGradMode grad_mode(true);
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : {hidden, weights, gate_up, down}) leaves.push_back(t.detach().requires_grad_(true));
  const at::Tensor out = detail::run_experts(leaves[0], experts, leaves[1], leaves[2], leaves[3], num_experts, spread, path);
  // No expert here (an uneven spread) computes nothing from the inputs: every gradient is zero.
  std::vector<at::Tensor> g(leaves.size());
  if (out.requires_grad())
    g = torch::autograd::grad({out}, leaves, {grad}, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t i = 0; i < g.size(); ++i)
    if (!g[i].defined()) g[i] = at::zeros_like(leaves[i]);
  return {g[0], g[1], g[2], g[3]};
}

at::Tensor moe_experts(const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights, const at::Tensor& gate_up,
                       const at::Tensor& down) {
  return detail::run_experts(hidden, experts, weights, gate_up, down, gate_up.size(0), {}, kForwardOp);
}

Gradients moe_experts_backward(const at::Tensor& grad, const at::Tensor& hidden, const at::Tensor& experts, const at::Tensor& weights,
                               const at::Tensor& gate_up, const at::Tensor& down) {
  return experts_gradients(grad, hidden, experts, weights, gate_up, down, gate_up.size(0), {}, kBackwardOp);
}

at::Tensor moe_experts_meta(const at::Tensor& hidden, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  return at::empty_like(hidden);
}

Gradients moe_experts_backward_meta(const at::Tensor&, const at::Tensor& hidden, const at::Tensor&, const at::Tensor& weights,
                                    const at::Tensor& gate_up, const at::Tensor& down) {
  return {at::empty_like(hidden), at::empty_like(weights), at::empty_like(gate_up), at::empty_like(down)};
}

TORCH_LIBRARY(dtensor, m) {
  m.def("moe_experts(Tensor hidden, Tensor experts, Tensor weights, Tensor gate_up, Tensor down) -> Tensor");
  m.def("moe_experts_backward(Tensor grad, Tensor hidden, Tensor experts, Tensor weights, Tensor gate_up, Tensor down) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(dtensor, CompositeExplicitAutograd, m) {
  m.impl("moe_experts", TORCH_FN(moe_experts));
  m.impl("moe_experts_backward", TORCH_FN(moe_experts_backward));
}
TORCH_LIBRARY_IMPL(dtensor, Meta, m) {
  m.impl("moe_experts", TORCH_FN(moe_experts_meta));
  m.impl("moe_experts_backward", TORCH_FN(moe_experts_backward_meta));
}

// ---- strategies ------------------------------------------------------------------------------------

struct Roles {
  size_t tokens_begin, gate_up;  // inputs [tokens_begin, gate_up) are per token; gate_up, down follow
  bool backward;
};
Roles roles_of(const OpSchema& s) { return s.inputs.size() == 6 ? Roles{1, 4, true} : Roles{0, 3, false}; }

// Bytes one exchange of every token's k rows moves per rank, there and back.
double exchange_bytes(const OpSchema& s, const Roles& r, int64_t ranks) {
  const TensorMeta& hidden = s.input(r.tokens_begin).meta;
  const int64_t k = s.input(r.tokens_begin + 1).meta.shape[1];
  const double rows = static_cast<double>(numel(hidden.shape) * k * static_cast<int64_t>(c10::elementSize(hidden.dtype)));
  return 2 * rows * static_cast<double>(ranks - 1) / static_cast<double>(ranks * ranks) + 3 * kCollectiveLatencyBytes;
}

std::vector<DimStrategy> per_dim(const OpSchema& s) {
  const Roles r = roles_of(s);
  const Placement R = Replicate(), S = Shard(0), P = Partial();
  auto inputs = [&](Placement grad, Placement tokens, Placement experts) {
    Placements in;
    if (r.backward) in.push_back(grad);
    for (size_t i = r.tokens_begin; i < r.gate_up; ++i) in.push_back(tokens);
    in.push_back(experts);
    in.push_back(experts);
    return in;
  };
  auto outputs = [&](Placement tokens, Placement experts) {
    return r.backward ? Placements{tokens, tokens, experts, experts} : Placements{tokens};
  };
  std::vector<DimStrategy> out = {{outputs(R, R), inputs(R, R, R)}, {outputs(S, P), inputs(S, S, R)}};
  if (r.backward) out.push_back({outputs(P, P), inputs(P, R, R)});
  out.push_back({r.backward ? outputs(P, S) : Placements{P}, inputs(R, R, S)});  // each rank's experts, outputs added up
  return out;
}

// The per-dim strategies on every mesh dim, experts spread over one dim at most, and the exchange
// (tokens and experts both sharded on a dim) where the dim's size divides the experts.
OpStrategy experts_on_mesh(const OpSchema& s) {
  const Roles r = roles_of(s);
  OpStrategy all = detail::expand_dim_strategies(per_dim(s), s.mesh->ndim(), s.outputs.size(), s.inputs.size());
  const int64_t experts = s.input(r.gate_up).meta.shape[0];
  OpStrategy exchanges;
  for (int64_t d = 0; d < s.mesh->ndim(); ++d) {
    if (experts % s.mesh->size(d) != 0) continue;
    for (const PlacementStrategy& st : all) {
      const auto dim = static_cast<size_t>(d);
      if (st.inputs[r.gate_up][dim] != Placement(Shard(0)) || st.inputs[r.tokens_begin][dim] != Placement(Replicate())) continue;
      PlacementStrategy exchange = st;
      for (size_t i = r.tokens_begin; i < r.gate_up; ++i) exchange.inputs[i][dim] = Shard(0);
      if (r.backward) exchange.inputs[0][dim] = Shard(0);
      for (Placements& out : exchange.outputs) out[dim] = Shard(0);
      exchange.kernel_cost += (r.backward ? 2 : 1) * exchange_bytes(s, r, s.mesh->size(d));
      exchanges.push_back(std::move(exchange));
    }
  }
  all.insert(all.end(), exchanges.begin(), exchanges.end());
  std::erase_if(all, [&](const PlacementStrategy& st) { return mesh_dims_sharding(st.inputs[r.gate_up], 0).size() > 1; });
  return all;
}

// The mesh dim over which `chosen` exchanges tokens (tokens and experts both sharded there), if any.
std::optional<int64_t> exchange_dim(const PlacementStrategy& chosen, const Roles& r) {
  const std::vector<int64_t> spread = mesh_dims_sharding(chosen.inputs[r.gate_up], 0);
  if (spread.empty() || chosen.inputs[r.tokens_begin][static_cast<size_t>(spread[0])] != Placement(Shard(0))) return std::nullopt;
  return spread[0];
}

// Runs the op on this rank's part: the assignments to the experts held here (every expert where the
// weights are whole; the rest skipped as dropped), or the exchange over the experts' dim. Every
// strategy has a kernel, so that graph programs hold the forms below instead of dtensor's op wherever
// a form exists (all but the exchange).
LocalKernel experts_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  const Roles r = roles_of(s);
  const std::optional<int64_t> exchange = exchange_dim(chosen, r);
  const ChunkExtent held = held_rows(s, s.input(r.gate_up).meta.shape, chosen.inputs[r.gate_up]);
  const int64_t num_experts = s.input(r.gate_up).meta.shape[0];
  return [mesh = s.mesh, r, exchange, held, num_experts](const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const auto args = torch::jit::pop(stack, op.schema().arguments().size());
    const size_t t = r.tokens_begin;
    const at::Tensor& hidden = args[t].toTensor();
    const at::Tensor &gate_up = args[r.gate_up].toTensor(), &down = args[r.gate_up + 1].toTensor();
    at::Tensor experts = args[t + 1].toTensor();
    detail::ExpertsSpread where;
    int64_t count = num_experts;
    if (exchange) {
      where = {mesh->shared_from_this(), *exchange};
    } else {  // this rank's experts renumbered from 0, the others dropped
      // Masking would drop an index out of range as if it were another rank's: refused first.
      detail::check_routing(experts, num_experts, op.schema().name());
      const at::Tensor mine = experts.ge(held.offset).logical_and(experts.lt(held.offset + held.size));
      experts = at::where(mine, experts - held.offset, held.size);
      count = held.size;
    }
    const std::string path = op.schema().name();
    if (!r.backward) return torch::jit::push(stack, detail::run_experts(hidden, experts, args[t + 2].toTensor(), gate_up, down, count, where, path));
    auto [g_hidden, g_weights, g_gate_up, g_down] =
        experts_gradients(args[0].toTensor(), hidden, experts, args[t + 2].toTensor(), gate_up, down, count, where, path);
    torch::jit::push(stack, g_hidden, g_weights, g_gate_up, g_down);
  };
}

// ---- graph forms: transformers' "batched_mm" experts on this rank's experts --------------------------
// Each token-expert pair selects its expert's weights and multiplies in a batch; pairs whose expert is
// not held here select expert 0 and are weighed 0. The exchange has no form: its split sizes are data.

struct LocalSizes {
  int64_t tokens, k, hidden, intermediate;
  ChunkExtent held;  // this rank's experts
};

LocalSizes local_sizes(const OpSchema& s, const PlacementStrategy& chosen, const Roles& r) {
  const size_t t = r.tokens_begin;
  return {local_part(s, s.input(t).meta.shape, chosen.inputs[t]).shape[0], s.input(t + 1).meta.shape[1], s.input(t).meta.shape[1],
          s.input(r.gate_up + 1).meta.shape[2], held_rows(s, s.input(r.gate_up).meta.shape, chosen.inputs[r.gate_up])};
}

// The pairs' values both forms read.
struct Pairs {
  FormValue held, index, weight, rows, gate_up, gate, up, activation, down, output;
};

Pairs pairs_form(GraphFormBuilder& b, const Roles& r, const LocalSizes& n) {
  const size_t t = r.tokens_begin;
  const FormValue experts = b.op("aten::reshape", {b.input(t + 1), std::vector<int64_t>{-1}}, "experts_flat");
  Pairs p;
  const FormValue held = p.held = b.op("aten::logical_and", {b.op("aten::ge.Scalar", {experts, n.held.offset}, "from_first"),
                                                    b.op("aten::lt.Scalar", {experts, n.held.offset + n.held.size}, "before_last")},
                              "held_here");
  p.index = b.op("aten::where.ScalarOther", {held, b.op("aten::sub.Scalar", {experts, n.held.offset}, "local_expert"), 0}, "pair_expert");
  p.weight = b.op("aten::mul.Tensor", {b.op("aten::reshape", {b.input(t + 2), std::vector<int64_t>{-1}}, "weights_flat"), held}, "pair_weight");
  p.rows = b.op("aten::repeat_interleave.self_int", {b.input(t), n.k, 0}, "pair_rows");
  p.gate_up = b.op("aten::index_select", {b.input(r.gate_up), 0, p.index}, "pair_gate_up");
  const FormValue both = b.op("aten::squeeze.dim", {b.op("aten::bmm", {p.gate_up, b.op("aten::unsqueeze", {p.rows, -1}, "rows_column")}, "gate_up_bmm"), -1}, "gate_and_up");
  p.gate = b.op("aten::slice.Tensor", {both, 1, 0, n.intermediate}, "gate");
  p.up = b.op("aten::slice.Tensor", {both, 1, n.intermediate, 2 * n.intermediate}, "up");
  p.activation = b.op("aten::mul.Tensor", {b.op("aten::silu", {p.gate}, "silu"), p.up}, "activation");
  p.down = b.op("aten::index_select", {b.input(r.gate_up + 1), 0, p.index}, "pair_down");
  const FormValue product = b.op("aten::bmm", {p.down, b.op("aten::unsqueeze", {p.activation, -1}, "activation_column")}, "down_bmm");
  p.output = b.op("aten::squeeze.dim", {product, -1}, "pair_output");
  return p;
}

// The sum of a pair tensor [tokens * k, hidden] over each token's k pairs.
FormValue per_token(GraphFormBuilder& b, FormValue pairs, const LocalSizes& n, const std::string& name) {
  return b.op("aten::sum.dim_IntList", {b.op("aten::view", {pairs, std::vector<int64_t>{-1, n.k, n.hidden}}, name + "_pairs"), std::vector<int64_t>{1}}, name);
}

std::vector<FormValue> forward_form(GraphFormBuilder& b, const Roles& r, const LocalSizes& n) {
  const Pairs p = pairs_form(b, r, n);
  return {per_token(b, b.op("aten::mul.Tensor", {p.output, b.op("aten::unsqueeze", {p.weight, -1}, "weight_column")}, "weighted"), n, "experts_out")};
}

// The gradient of `pairs` [tokens * k, ...] per expert: each pair's added into its expert's row.
FormValue per_expert(GraphFormBuilder& b, FormValue like, FormValue index, FormValue pairs, const std::string& name) {
  const FormValue zeros = b.op("aten::zeros_like", {like}, name + "_zeros");
  return b.op("aten::index_add", {zeros, 0, index, pairs}, name);
}

std::vector<FormValue> backward_form(GraphFormBuilder& b, const Roles& r, const LocalSizes& n) {
  const Pairs p = pairs_form(b, r, n);
  const FormValue grad = b.op("aten::repeat_interleave.self_int", {b.input(0), n.k, 0}, "pair_grad");
  const FormValue weight_grad = b.op("aten::mul.Tensor", {b.op("aten::sum.dim_IntList", {b.op("aten::mul.Tensor", {grad, p.output}, "grad_output"), std::vector<int64_t>{-1}}, "pair_weight_grad_raw"),
                                                          p.held}, "pair_weight_grad");
  const FormValue output_grad = b.op("aten::mul.Tensor", {grad, b.op("aten::unsqueeze", {p.weight, -1}, "weight_column")}, "pair_output_grad");
  const FormValue output_column = b.op("aten::unsqueeze", {output_grad, -1}, "output_grad_column");
  const FormValue down_grad = b.op("aten::bmm", {output_column, b.op("aten::unsqueeze", {p.activation, 1}, "activation_row")}, "pair_down_grad");
  const FormValue activation_grad = b.op("aten::squeeze.dim", {b.op("aten::bmm", {b.op("aten::transpose.int", {p.down, 1, 2}, "down_t"), output_column}, "activation_bmm"), -1}, "activation_grad");
  const FormValue gate_grad = b.op("aten::silu_backward", {b.op("aten::mul.Tensor", {activation_grad, p.up}, "silu_grad"), p.gate}, "gate_grad");
  const FormValue up_grad = b.op("aten::mul.Tensor", {activation_grad, b.op("aten::silu", {p.gate}, "silu_again")}, "up_grad");
  const FormValue both_column = b.op("aten::unsqueeze", {b.op("aten::cat", {std::vector<FormValue>{gate_grad, up_grad}, 1}, "gate_up_grad"), -1}, "gate_up_grad_column");
  const FormValue rows_grad = b.op("aten::squeeze.dim", {b.op("aten::bmm", {b.op("aten::transpose.int", {p.gate_up, 1, 2}, "gate_up_t"), both_column}, "rows_bmm"), -1}, "pair_rows_grad");
  const FormValue gate_up_grad = b.op("aten::bmm", {both_column, b.op("aten::unsqueeze", {p.rows, 1}, "rows_row")}, "pair_gate_up_grad");
  return {per_token(b, rows_grad, n, "hidden_grad"),
          b.op("aten::view", {weight_grad, std::vector<int64_t>{-1, n.k}}, "weights_grad"),
          per_expert(b, b.input(r.gate_up), p.index, gate_up_grad, "gate_up_proj_grad"),
          per_expert(b, b.input(r.gate_up + 1), p.index, down_grad, "down_proj_grad")};
}

// Where this rank holds no expert or no token there is nothing to select: zeros, as the kernel gives.
std::vector<FormValue> zeros_form(GraphFormBuilder& b, const Roles& r) {
  const size_t t = r.tokens_begin;
  std::vector<size_t> shaped_like = {t};
  if (r.backward) shaped_like = {t, t + 2, r.gate_up, r.gate_up + 1};
  std::vector<FormValue> out;
  for (size_t arg : shaped_like) out.push_back(b.op("aten::zeros_like", {b.input(arg)}, "experts_zeros"));
  return out;
}

GraphForm experts_form(const OpSchema& s, const PlacementStrategy& chosen) {
  const Roles r = roles_of(s);
  const size_t t = r.tokens_begin;
  if (exchange_dim(chosen, r) || s.input(t).meta.dtype != s.input(t + 2).meta.dtype) return {};
  const LocalSizes n = local_sizes(s, chosen, r);
  if (n.held.size == 0 || n.tokens == 0) return [r](GraphFormBuilder& b) { return zeros_form(b, r); };
  return [r, n](GraphFormBuilder& b) { return r.backward ? backward_form(b, r, n) : forward_form(b, r, n); };
}

const bool experts_rules_registered = [] {
  detail::register_overloads({kForwardOp, kBackwardOp},
                             {.mesh = experts_on_mesh, .local_kernel = experts_kernel, .graph_form = experts_form, .family = "experts"});
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
