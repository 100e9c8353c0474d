// Samples for the loss family. Uneven over 4 ranks: 5 samples, 7 classes (2, 2, 2, 1). Class targets
// (input 1) are int64 in range with one ignored entry; class weights (input 2) are positive and
// detached in the call, as nll_loss has no gradient for them.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

constexpr int64_t kIgnore = -100;  // nll_loss's default ignore_index

// Targets spread over [0, classes) (the first and the last class included), the second one ignored.
at::Tensor class_targets(const Shape& shape, int64_t classes, int64_t ignore_index) {
  at::Tensor t = at::arange(numel(shape), at::kLong).mul_(3).remainder_(classes);
  if (t.numel() > 1) t[1] = ignore_index;
  return t.reshape(shape);
}

// Inputs of (self, target, weight) calls with `classes` classes.
std::function<at::Tensor(size_t, const Shape&)> classification_inputs(int64_t classes, int64_t ignore_index) {
  return [classes, ignore_index](size_t i, const Shape& shape) {
    if (i == 1) return class_targets(shape, classes, ignore_index);
    const at::Tensor t = test_tensor(shape, at::kDouble, 600 + i);
    return i == 2 ? t.abs() + 1 : t;
  };
}

at::Tensor weight_of(In x) { return x.size() > 2 ? x[2].detach() : at::Tensor(); }

OpSample classification(std::string name, std::vector<Shape> shapes, std::function<at::Tensor(In)> call,
                        bool two_d = false, int64_t ignore_index = kIgnore) {
  const int64_t classes = shapes[0][shapes[0].size() >= 2 ? 1 : 0];
  return {.name = std::move(name),
          .shapes = std::move(shapes),
          .run = [call](In x) { return outputs(call(x)); },
          .make_input = classification_inputs(classes, ignore_index),
          .two_d = two_d};
}

// Losses and their gradients are linear in some inputs (nll_loss in self, the backward ops in
// grad_output): those are also tried Partial.
const std::vector<Placement> kWithPartial2d{Replicate(), Shard(0), Shard(1), Partial()};
const std::vector<Placement> kWithPartial0d{Replicate(), Partial()};
const std::vector<Placement> k2d{Replicate(), Shard(0), Shard(1)};

// nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight) called
// directly, with inputs (grad_output [], self [5, 7], target [5], total_weight []).
OpSample nll_backward(std::string name, int64_t reduction) {
  return {.name = std::move(name),
          .shapes = {{}, {5, 7}, {5}, {}},
          .run = [reduction](In x) {
            return outputs(at::nll_loss_backward(x[0], x[1], x[2], {}, reduction, kIgnore, x[3]));
          },
          .make_input = [](size_t i, const Shape& shape) {
            if (i == 2) return class_targets(shape, 7, kIgnore);
            return i == 3 ? at::full({}, 3.0, at::kDouble) : test_tensor(shape, at::kDouble, 700 + i);
          },
          .placements = {kWithPartial0d, k2d, {Replicate(), Shard(0)}, {Replicate()}},
          .differentiable = {true, true, false, false}};  // total_weight has no derivative
}

const Shape kLogits{5, 7}, kTargets{5}, kWeights{7};
const Shape kImage{2, 5, 3, 2}, kPixels{2, 3, 2}, kImageWeights{5};

const bool loss_samples_registered = add_op_samples({
    // nll_loss: nll_loss_forward / nll_loss_backward
    classification("nll_loss_mean", {kLogits, kTargets, kWeights},
                   [](In x) { return at::nll_loss(x[0], x[1], weight_of(x)); }, /*two_d=*/true),
    classification("nll_loss_sum", {kLogits, kTargets, kWeights},
                   [](In x) { return at::nll_loss(x[0], x[1], weight_of(x), at::Reduction::Sum); }),
    classification("nll_loss_none", {kLogits, kTargets, kWeights},
                   [](In x) { return at::nll_loss(x[0], x[1], weight_of(x), at::Reduction::None); }),
    classification("nll_loss_ignore_index_no_weight", {kLogits, kTargets},
                   [](In x) { return at::nll_loss(x[0], x[1], {}, at::Reduction::Mean, 3); }, false, 3),
    [] {
      OpSample s = classification("nll_loss_partial_logits", {kLogits, kTargets, kWeights},
                                  [](In x) { return at::nll_loss(x[0], x[1], weight_of(x)); });
      s.placements = {kWithPartial2d, {Replicate(), Shard(0)}, {Replicate()}};
      return s;
    }(),
    nll_backward("nll_loss_backward_mean", at::Reduction::Mean),
    nll_backward("nll_loss_backward_sum", at::Reduction::Sum),
    classification("nll_loss_unbatched", {kWeights, {}}, [](In x) { return at::nll_loss(x[0], x[1]); }),
    // nll_loss_nd on 4-d input: nll_loss2d_forward / nll_loss2d_backward
    classification("nll_loss2d_mean", {kImage, kPixels, kImageWeights},
                   [](In x) { return at::nll_loss_nd(x[0], x[1], weight_of(x)); }),
    classification("nll_loss2d_none", {kImage, kPixels},
                   [](In x) { return at::nll_loss_nd(x[0], x[1], {}, at::Reduction::None); }),
    // cross_entropy: _log_softmax + nll_loss, and their backward ops
    classification("cross_entropy_mean", {kLogits, kTargets},
                   [](In x) { return at::cross_entropy_loss(x[0], x[1]); }, /*two_d=*/true),
    classification("cross_entropy_weighted_sum", {kLogits, kTargets, kWeights},
                   [](In x) { return at::cross_entropy_loss(x[0], x[1], weight_of(x), at::Reduction::Sum, 0); }, false, 0),
    classification("cross_entropy_none", {kLogits, kTargets},
                   [](In x) { return at::cross_entropy_loss(x[0], x[1], {}, at::Reduction::None); }),
    classification("cross_entropy_2d", {kImage, kPixels}, [](In x) { return at::cross_entropy_loss(x[0], x[1]); }),
    // log_softmax over any dim
    {.name = "log_softmax", .shapes = {kLogits}, .run = [](In x) { return outputs(at::log_softmax(x[0], 1)); }, .two_d = true},
    {.name = "log_softmax_dim0", .shapes = {{5, 7, 2}}, .run = [](In x) { return outputs(at::log_softmax(x[0], 0)); }},
    {.name = "log_softmax_backward_data",
     .shapes = {kLogits, kLogits},
     .run = [](In x) { return outputs(at::_log_softmax_backward_data(x[0], x[1], 1, at::kDouble)); },
     .placements = {kWithPartial2d, k2d}},
    // mse_loss / mse_loss_backward
    {.name = "mse_loss_mean", .shapes = {{5, 3}, {5, 3}}, .run = [](In x) { return outputs(at::mse_loss(x[0], x[1])); }, .two_d = true},
    {.name = "mse_loss_sum",
     .shapes = {{5, 3}, {5, 3}},
     .run = [](In x) { return outputs(at::mse_loss(x[0], x[1], at::Reduction::Sum)); }},
    {.name = "mse_loss_none",
     .shapes = {{5, 3}, {5, 3}},
     .run = [](In x) { return outputs(at::mse_loss(x[0], x[1], at::Reduction::None)); }},
    {.name = "mse_loss_broadcast_target", .shapes = {{5, 3}, {3}}, .run = [](In x) { return outputs(at::mse_loss(x[0], x[1])); }},
    {.name = "mse_loss_backward_mean",
     .shapes = {{}, {5, 3}, {5, 3}},
     .run = [](In x) { return outputs(at::mse_loss_backward(x[0], x[1], x[2], at::Reduction::Mean)); },
     .placements = {kWithPartial0d, k2d, k2d}},
    {.name = "mse_loss_backward_none",
     .shapes = {{5, 3}, {5, 3}, {5, 3}},
     .run = [](In x) { return outputs(at::mse_loss_backward(x[0], x[1], x[2], at::Reduction::None)); },
     .placements = {kWithPartial2d, k2d, k2d}},
});

}  // namespace
}  // namespace dtensor::testing
