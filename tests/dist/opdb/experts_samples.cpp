// Samples for dtensor's experts ops (src/sharding/rules/experts.cpp), the mixture of experts' experts
// graph programs run: 6 tokens (uneven over 4 ranks), top 2 of 4 experts (one assignment dropped, one
// expert chosen by no token), hidden 4, intermediate 3; and of 3 experts, which Shard(0) spreads
// unevenly (one rank holds none). Each placement of the tokens and of the
// experts' weights runs as one of the rule's strategies (or is moved to one), against the op on one
// device, forward and (for the forward op, by autograd) backward.

#include <ATen/core/dispatch/Dispatcher.h>

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

constexpr int64_t kTokens = 6, kTopK = 2, kHidden = 4, kIntermediate = 3;

// The chosen experts of `experts` (index `experts` marks a dropped assignment); the rest integer-valued
// doubles, scaled down so that the SwiGLU stays in its curved range.
at::Tensor experts_input(size_t i, size_t experts_at, int64_t experts, const Shape& shape) {
  const int64_t last = experts - 1;
  if (i == experts_at) return at::tensor(std::vector<int64_t>{0, 1, 1, last, last, 0, 0, experts, 1, 0, last, 1}, at::kLong).reshape(shape);
  return test_tensor(shape, at::kDouble, 700 + i) / 8;
}

const std::vector<Placement> kPlacements = {Replicate(), Shard(0)};

at::Tensor moe_experts(In x) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("dtensor::moe_experts", "").typed<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(x[0], x[1], x[2], x[3], x[4]);
}

std::vector<at::Tensor> moe_experts_backward(In x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("dtensor::moe_experts_backward", "")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&)>();
  auto [hidden, weights, gate_up, down] = op.call(x[0], x[1], x[2], x[3], x[4], x[5]);
  return outputs(hidden, weights, gate_up, down);
}

const Shape kTokensShape{kTokens, kHidden}, kRouting{kTokens, kTopK};

OpSample forward_sample(const std::string& name, int64_t experts) {
  return {.name = name,
          .shapes = {kTokensShape, kRouting, kRouting, {experts, 2 * kIntermediate, kHidden}, {experts, kHidden, kIntermediate}},
          .run = [](In x) { return outputs(moe_experts(x)); },
          .make_input = [experts](size_t i, const Shape& s) { return experts_input(i, 1, experts, s); },
          .placements = {kPlacements, kPlacements, kPlacements, kPlacements, kPlacements},
          .backward = true,  // through its autograd kernel (src/sharding/rules/experts_autograd.cpp): moe_experts_backward
          .rtol = 1e-6,
          .atol = 1e-9,
          .partial_inputs = false};
}

OpSample backward_sample(const std::string& name, int64_t experts) {
  return {.name = name,
          .shapes = {kTokensShape, kTokensShape, kRouting, kRouting, {experts, 2 * kIntermediate, kHidden}, {experts, kHidden, kIntermediate}},
          .run = moe_experts_backward,
          .make_input = [experts](size_t i, const Shape& s) { return experts_input(i, 2, experts, s); },
          .placements = {{Replicate(), Shard(0), Partial()}, kPlacements, kPlacements, kPlacements, kPlacements, kPlacements},
          .backward = false,
          .rtol = 1e-6,
          .atol = 1e-9,
          .no_backward_reason = "a gradient op: graph programs do not differentiate it again",
          .partial_inputs = false};
}

const bool experts_samples_registered = add_op_samples({
    forward_sample("moe_experts", 4),
    backward_sample("moe_experts_backward", 4),
    forward_sample("moe_experts_three_experts", 3),
    backward_sample("moe_experts_backward_three_experts", 3),
});

}  // namespace
}  // namespace dtensor::testing
