// Samples for batch normalisation (native_batch_norm and its backward), uneven over 4 ranks: batch 5
// (2, 2, 1, 0) and 7 channels (2, 2, 2, 1). In training the statistics reduce over the batch and
// spatial dims, whichever are sharded; the running statistics (inputs 3 and 4, updated in place) are
// returned after the call, so their update is compared too. The backward op is also called directly,
// with Partial gradients.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

// input, weight, bias, running_mean, running_var: a positive running_var.
at::Tensor batch_norm_input(size_t i, const Shape& shape) {
  const at::Tensor t = test_tensor(shape, at::kDouble, 800 + i);
  return i == 4 ? t.abs() + 1 : t;
}

// batch_norm with running statistics: its output and the statistics after the update.
OpSample with_running_stats(std::string name, Shape input, bool training, bool two_d = false) {
  const int64_t channels = input[1];
  return {.name = std::move(name),
          .shapes = {input, {channels}, {channels}, {channels}, {channels}},
          .run = [training](In x) {
            at::Tensor out = at::batch_norm(x[0], x[1], x[2], x[3], x[4], training, 0.3, 1e-5, false);
            return outputs(out, x[3], x[4]);
          },
          .make_input = batch_norm_input,
          .two_d = two_d,
          .differentiable = {true, true, true, false, false}};
}

// native_batch_norm_backward called directly in training, every gradient asked for: grad_out is also
// tried Partial (the gradients are linear in it). Inputs: grad_out, input, weight, save_mean and a
// positive save_invstd.
OpSample batch_norm_backward_sample() {
  const std::vector<Placement> activations{Replicate(), Shard(0), Shard(1), Shard(2)};
  return {.name = "native_batch_norm_backward",
          .shapes = {{5, 7, 3}, {5, 7, 3}, {7}, {7}, {7}},
          .run = [](In x) {
            const auto [gi, gw, gb] = at::native_batch_norm_backward(x[0], x[1], x[2], {}, {}, x[3], x[4], true, 1e-5,
                                                                     {true, true, true});
            return outputs(gi, gw, gb);
          },
          .make_input = [](size_t i, const Shape& shape) {
            const at::Tensor t = test_tensor(shape, at::kDouble, 850 + i);
            return i == 4 ? t.abs() / 8 + 1 : t;
          },
          .placements = {{Replicate(), Shard(0), Shard(1), Partial()}, activations, {Replicate(), Shard(0)},
                         {Replicate(), Shard(0)}, {Replicate(), Shard(0)}},
          .differentiable = {true, true, true, false, false},  // LibTorch has no derivative for the saved statistics
          .partial_inputs = false};
}

const bool batch_norm_samples_registered = add_op_samples({
    batch_norm_backward_sample(),
    with_running_stats("batch_norm_training", {5, 7, 3}, true, /*two_d=*/true),
    with_running_stats("batch_norm_training_2d", {5, 3, 2, 3}, true),
    with_running_stats("batch_norm_eval", {5, 7, 3}, false, /*two_d=*/true),
    [] {
      OpSample legit = with_running_stats("_native_batch_norm_legit", {5, 7, 3}, true);
      legit.run = [](In x) {
        at::Tensor running_mean = x[3], running_var = x[4];  // the same tensors, updated in place
        const auto [out, mean, invstd] = at::_native_batch_norm_legit(x[0], x[1], x[2], running_mean, running_var, true, 0.3, 1e-5);
        return outputs(out, x[3], x[4]);
      };
      return legit;
    }(),
    // Core ATen's other forms: eval, no running statistics, the functional forms returning the updated
    // statistics, and _batch_norm_with_update (training, in place, with an empty reserve).
    [] {
      OpSample eval = with_running_stats("_native_batch_norm_legit_no_training", {5, 7, 3}, false, /*two_d=*/true);
      eval.run = [](In x) {
        return outputs(std::get<0>(at::_native_batch_norm_legit_no_training(x[0], x[1], x[2], x[3], x[4], 0.3, 1e-5)));
      };
      return eval;
    }(),
    {.name = "_native_batch_norm_legit_no_stats",
     .shapes = {{5, 7, 3}, {7}, {7}},
     .run = [](In x) {
       const auto [out, mean, invstd] = at::_native_batch_norm_legit(x[0], x[1], x[2], true, 0.3, 1e-5);
       return outputs(out, mean, invstd);
     },
     .two_d = true},
    [] {
      OpSample functional = with_running_stats("_native_batch_norm_legit_functional", {5, 7, 3}, true, /*two_d=*/true);
      functional.run = [](In x) {
        const auto [out, mean, invstd, running_mean, running_var] =
            at::_native_batch_norm_legit_functional(x[0], x[1], x[2], x[3], x[4], true, 0.3, 1e-5);
        return outputs(out, running_mean, running_var, x[3], x[4]);  // the inputs stay as they were
      };
      return functional;
    }(),
    [] {
      OpSample update = with_running_stats("_batch_norm_with_update", {5, 7, 3}, true, /*two_d=*/true);
      update.run = [](In x) {
        at::Tensor running_mean = x[3], running_var = x[4];
        const auto [out, mean, invstd, reserve] = at::_batch_norm_with_update(x[0], x[1], x[2], running_mean, running_var, 0.3, 1e-5);
        return outputs(out, x[3], x[4]);
      };
      return update;
    }(),
    [] {
      OpSample functional = with_running_stats("_batch_norm_with_update_functional", {5, 7, 3}, true);
      functional.run = [](In x) {
        const auto [out, mean, invstd, reserve, running_mean, running_var] =
            at::_batch_norm_with_update_functional(x[0], x[1], x[2], x[3], x[4], 0.3, 1e-5);
        return outputs(out, running_mean, running_var);
      };
      return functional;
    }(),
    // Without affine parameters or running statistics (BatchNorm1d on [N, C], track_running_stats off).
    {.name = "batch_norm_batch_statistics_only",
     .shapes = {{5, 7}},
     .run = [](In x) { return outputs(at::batch_norm(x[0], {}, {}, {}, {}, true, 0.1, 1e-5, false)); }},
    // The input's gradient not asked for: the weight's and bias's stay per-rank sums (Partial).
    {.name = "batch_norm_input_without_grad",
     .shapes = {{5, 7, 3}, {7}, {7}},
     .run = [](In x) { return outputs(at::batch_norm(x[0].detach(), x[1], x[2], {}, {}, true, 0.1, 1e-5, false)); }},
});

}  // namespace
}  // namespace dtensor::testing
