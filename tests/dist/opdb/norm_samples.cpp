// Samples for the normalisation family: softmax (log_softmax is the loss family's), layer_norm and
// rms_norm (which decomposes into pointwise ops and mean) on [5, 6] and [2, 5, 6] inputs, 5 being
// uneven over 4 ranks.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

const bool norm_samples_registered = add_op_samples({
    {"softmax", {{5, 6}}, [](In x) { return outputs(at::softmax(x[0], 1)); }, nullptr, {}, true, true},
    {"softmax_dim0", {{2, 5, 6}}, [](In x) { return outputs(at::softmax(x[0], 0)); }},
    // A row of -inf (a fully masked attention row) gives zeros, not NaN.
    {"_safe_softmax", {{5, 6}}, [](In x) { return outputs(at::_safe_softmax(x[0].masked_fill(x[0] > 0.5, -INFINITY), 1)); }},
    {"layer_norm", {{5, 6}, {6}, {6}}, [](In x) { return outputs(at::layer_norm(x[0], {6}, x[1], x[2])); },
     nullptr, {}, true, true},
    {"layer_norm_3d", {{2, 5, 6}, {5, 6}, {5, 6}},
     [](In x) { return outputs(at::layer_norm(x[0], {5, 6}, x[1], x[2], 1e-3)); }},
    {"layer_norm_no_affine", {{2, 5, 6}}, [](In x) { return outputs(at::layer_norm(x[0], {6})); }},
    // Gradients not asked for come back undefined from native_layer_norm_backward.
    {"layer_norm_bias_only", {{5, 6}, {6}}, [](In x) { return outputs(at::layer_norm(x[0], {6}, {}, x[1])); }},
    {"layer_norm_input_without_grad", {{5, 6}, {6}, {6}},
     [](In x) { return outputs(at::layer_norm(x[0].detach(), {6}, x[1], x[2])); }},
    // rms_norm decomposes into pow, mean over the normalized dims (Partial(sum) when they are sharded),
    // add_(eps) and rsqrt.
    {"rms_norm", {{5, 6}, {6}}, [](In x) { return outputs(at::rms_norm(x[0], {6}, x[1], 1e-5)); }, nullptr, {}, true,
     true},
    {"rms_norm_3d_no_weight", {{2, 5, 6}}, [](In x) { return outputs(at::rms_norm(x[0], {5, 6})); }},
});

}  // namespace
}  // namespace dtensor::testing
