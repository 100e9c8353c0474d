// The _foreach_* ops and the fused Adam steps (optimizers' list kernels: one elementwise op over lists of tensors, element by
// element). Each element runs on its own, so each follows its own leader, the element of the first
// list argument: its placements, with Partial kept only where the op is linear in it, are what the
// element's other list members are moved to and what its output gets. Single tensors beside the lists
// (_foreach_add.Tensor's 0-d other, addcmul's per-element scalars) are Replicate, and so are 0-d
// members of shaped elements (_fused_adam's step counts). An element whose members differ in shape
// otherwise (broadcasting) runs Replicate.

#include <set>

#include "../../mesh/collectives.h"
#include "../registry.h"
#include "rule_helpers.h"

namespace dtensor::rules {
namespace {

enum class Linearity {
  None,      // a Partial element is reduced first
  Additive,  // every member may be Partial alike: sum_r (x_r + a y_r) = X + a Y
  Scaling,   // the leader may be Partial, scaled by numbers: sum_r c x_r = c X
};

// Linear ops keep Partial(sum) and, over floating values, Partial(avg) (see linear_reduce_ops).
std::vector<ReduceOp> kept_partials(const OpSchema& s, Linearity linearity) {
  return linearity == Linearity::None ? std::vector<ReduceOp>{} : linear_reduce_ops(s);
}

// The list elements: element i's tensor inputs (indices into s.inputs), its leader first.
std::vector<std::vector<size_t>> elements(const OpSchema& s) {
  std::optional<size_t> first_list;
  for (const TensorInput& in : s.inputs)
    if (in.list_index >= 0 && (!first_list || in.arg < *first_list)) first_list = in.arg;
  std::vector<std::vector<size_t>> out;
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (s.inputs[i].arg == first_list) out.push_back({i});
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const TensorInput& in = s.inputs[i];
    if (in.list_index < 0 || in.arg == first_list) continue;
    if (static_cast<size_t>(in.list_index) >= out.size())
      throw DTensorError(s.op_name() + ": its tensor lists differ in length (" + std::to_string(out.size()) + " and more)");
    out[static_cast<size_t>(in.list_index)].push_back(i);
  }
  return out;
}

// A per-element number beside a shaped element (_fused_adam's state_steps): Replicate, whatever the
// element's placements.
bool is_number_beside(const OpSchema& s, size_t input, size_t leader) {
  return s.input(input).meta.shape.empty() && !s.input(leader).meta.shape.empty();
}

// Element `members`' placements: the leader's, Partial kept where the op is linear in every member
// that has it.
Placements element_placements(const OpSchema& s, const std::vector<size_t>& members, Linearity linearity) {
  const DTensorSpec& leader = s.input(members[0]);
  const auto keep = kept_partials(s, linearity);
  bool same_shapes = true;
  for (size_t i : members) same_shapes = same_shapes && (s.input(i).meta.shape == leader.meta.shape || is_number_beside(s, i, members[0]));
  Placements out;
  for (size_t m = 0; m < leader.placements.size(); ++m) {
    const Placement& p = leader.placements[m];
    bool kept = p.is_shard() && same_shapes;
    if (p.is_partial() && std::find(keep.begin(), keep.end(), p.reduce_op()) != keep.end()) {
      kept = linearity == Linearity::Scaling ? members.size() == 1 : same_shapes;
      for (size_t i : members) kept = kept && s.input(i).placements[m] == p;
    }
    out.push_back(kept ? p : Replicate());
  }
  return out;
}

// Every input and output Replicate on every mesh dim (the strategy to start from, and the fallback).
PlacementStrategy replicated(const OpSchema& s) {
  const Placements replicate(static_cast<size_t>(s.mesh->ndim()), Replicate());
  return {std::vector<Placements>(s.outputs.size(), replicate), std::vector<Placements>(s.inputs.size(), replicate), {}};
}

// Outputs come as lists of one entry per element (_fused_adam returns five such lists).
OpStrategy follow_leaders(const OpSchema& s, Linearity linearity) {
  const auto groups = elements(s);
  if (!s.outputs.empty() && (groups.empty() || s.outputs.size() % groups.size() != 0))
    throw DTensorError(s.op_name() + ": " + std::to_string(s.outputs.size()) + " outputs for " + std::to_string(groups.size()) +
                       " list elements");
  PlacementStrategy follow = replicated(s);
  for (size_t e = 0; e < groups.size(); ++e) {
    const Placements placements = element_placements(s, groups[e], linearity);
    for (size_t i : groups[e])
      if (!is_number_beside(s, i, groups[e][0])) follow.inputs[i] = placements;
    for (size_t k = e; k < s.outputs.size(); k += groups.size()) follow.outputs[k] = placements;
  }
  return {std::move(follow), replicated(s)};
}

// _foreach_powsum reduces each element to a number, sum |x|^ord: a sharded element gives the
// Partial(sum) of its shards' sums (an empty shard's is 0), a Partial element is made whole first
// (|x|^ord is not linear).
OpStrategy power_sums(const OpSchema& s) {
  const auto groups = elements(s);
  const auto mesh_ndim = static_cast<size_t>(s.mesh->ndim());
  PlacementStrategy sums = replicated(s);
  for (size_t e = 0; e < groups.size() && e < s.outputs.size(); ++e) {
    const Placements& leader = s.input(groups[e][0]).placements;
    for (size_t m = 0; m < mesh_ndim; ++m)
      if (leader[m].is_shard()) {
        sums.inputs[groups[e][0]][m] = leader[m];
        sums.outputs[e][m] = Partial(ReduceOp::Sum);
      }
  }
  return {std::move(sums), replicated(s)};
}

detail::OpRule rule(Linearity linearity) {
  return {.mesh = [linearity](const OpSchema& s) { return follow_leaders(s, linearity); }, .family = "foreach"};
}

// _amp_foreach_non_finite_check_and_unscale_(grads!, found_inf!, inv_scale), GradScaler's step: each
// rank unscales its shards and flags a non-finite value it holds; the flags then meet in one
// all-reduce (max) over the mesh dims that shard any gradient, so that every rank skips the step
// alike. Partial gradients are reduced first (Linearity::None): a sum of finite contributions can
// overflow.
LocalKernel unscale_kernel(const OpSchema& s, const PlacementStrategy& chosen) {
  std::set<int64_t> dims;
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (s.inputs[i].list_index >= 0)
      for (int64_t m : sharding_mesh_dims(chosen.inputs[i])) dims.insert(m);
  if (dims.empty()) return {};
  return [mesh = s.mesh, dims = std::vector<int64_t>(dims.begin(), dims.end())](const c10::OperatorHandle& op,
                                                                                 torch::jit::Stack& stack) {
    at::Tensor found_inf = stack[stack.size() - 2].toTensor();
    op.callBoxed(stack);
    detail::all_reduce_over(*mesh, dims, found_inf, ReduceOp::Max);
  };
}

const bool foreach_rules_registered = [] {
  using detail::register_family;
  using detail::register_overloads;
  register_family({"aten::_foreach_abs", "aten::_foreach_acos", "aten::_foreach_asin", "aten::_foreach_atan", "aten::_foreach_ceil",
                   "aten::_foreach_cos", "aten::_foreach_cosh", "aten::_foreach_erf", "aten::_foreach_erfc", "aten::_foreach_exp",
                   "aten::_foreach_expm1", "aten::_foreach_floor", "aten::_foreach_frac", "aten::_foreach_lgamma", "aten::_foreach_log",
                   "aten::_foreach_log10", "aten::_foreach_log1p", "aten::_foreach_log2", "aten::_foreach_reciprocal",
                   "aten::_foreach_round", "aten::_foreach_rsqrt", "aten::_foreach_sigmoid", "aten::_foreach_sign", "aten::_foreach_sin",
                   "aten::_foreach_sinh", "aten::_foreach_sqrt", "aten::_foreach_tan", "aten::_foreach_tanh", "aten::_foreach_trunc",
                   "aten::_foreach_clamp_max", "aten::_foreach_clamp_min", "aten::_foreach_maximum", "aten::_foreach_minimum",
                   "aten::_foreach_lerp", "aten::_foreach_pow"},
                  rule(Linearity::None));
  // Not the functional .Tensor forms: their Meta kernels read the per-element numbers, which a meta
  // tensor does not hold, so their output metas cannot be computed (PyTorch's DTensor has no rule for
  // them either). The in-place forms need no output metas.
  register_overloads({"aten::_foreach_addcmul.Scalar", "aten::_foreach_addcmul.ScalarList", "aten::_foreach_addcmul_.Scalar",
                      "aten::_foreach_addcmul_.ScalarList", "aten::_foreach_addcmul_.Tensor", "aten::_foreach_addcdiv.Scalar",
                      "aten::_foreach_addcdiv.ScalarList", "aten::_foreach_addcdiv_.Scalar", "aten::_foreach_addcdiv_.ScalarList",
                      "aten::_foreach_addcdiv_.Tensor"},
                     rule(Linearity::None));
  register_family({"aten::_foreach_neg", "aten::_foreach_clone", "aten::_foreach_zero"}, rule(Linearity::Additive));
  // x + a y is linear for two lists; x + c (a number) is affine, and must see X whole.
  register_overloads({"aten::_foreach_add.List", "aten::_foreach_add_.List", "aten::_foreach_sub.List", "aten::_foreach_sub_.List"},
                     rule(Linearity::Additive));
  register_overloads({"aten::_foreach_add.Scalar", "aten::_foreach_add_.Scalar", "aten::_foreach_add.ScalarList",
                      "aten::_foreach_add_.ScalarList", "aten::_foreach_add.Tensor", "aten::_foreach_add_.Tensor",
                      "aten::_foreach_sub.Scalar", "aten::_foreach_sub_.Scalar", "aten::_foreach_sub.ScalarList",
                      "aten::_foreach_sub_.ScalarList", "aten::_foreach_mul.List", "aten::_foreach_mul_.List",
                      "aten::_foreach_div.List", "aten::_foreach_div_.List"},
                     rule(Linearity::None));
  register_overloads({"aten::_foreach_mul.Scalar", "aten::_foreach_mul_.Scalar", "aten::_foreach_mul.ScalarList",
                      "aten::_foreach_mul_.ScalarList", "aten::_foreach_mul.Tensor", "aten::_foreach_mul_.Tensor",
                      "aten::_foreach_div.Scalar", "aten::_foreach_div_.Scalar", "aten::_foreach_div.ScalarList",
                      "aten::_foreach_div_.ScalarList", "aten::_foreach_div.Tensor", "aten::_foreach_div_.Tensor"},
                     rule(Linearity::Scaling));
  register_overloads({"aten::_foreach_powsum.Scalar"}, {.mesh = power_sums, .family = "foreach"});
  // The fused optimizer steps: per element a parameter, its gradient and moments (all placed alike) and
  // its step count (a number, Replicate).
  register_overloads({"aten::_fused_adam", "aten::_fused_adam.tensor_lr", "aten::_fused_adam_", "aten::_fused_adam_.tensor_lr",
                      "aten::_fused_adamw", "aten::_fused_adamw.tensor_lr", "aten::_fused_adamw_", "aten::_fused_adamw_.tensor_lr"},
                     rule(Linearity::None));
  detail::OpRule unscale = rule(Linearity::None);
  unscale.local_kernel = unscale_kernel;
  register_overloads({"aten::_amp_foreach_non_finite_check_and_unscale_"}, unscale);
  return true;
}();

}  // namespace
}  // namespace dtensor::rules
