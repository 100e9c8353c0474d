// Samples for the attention family: scaled_dot_product_attention as LibTorch code calls it, which on
// the CPU runs the fused _scaled_dot_product_flash_attention_for_cpu (and its backward) on DTensors.
// 5 heads and 6 queries over 4 ranks are uneven (one rank has no head); keys are longer than queries.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

// Small values: scores stay in softmax's sensitive range, so gradients are not all zero.
at::Tensor small_values(size_t i, const Shape& shape) { return test_tensor(shape, at::kDouble, 100 + i) / 8; }

const std::vector<Placement> queries = {Replicate(), Shard(0), Shard(1), Shard(2)};
const std::vector<Placement> keys = {Replicate(), Shard(1)};

const bool attention_samples_registered = add_op_samples({
    {.name = "scaled_dot_product_attention",
     .shapes = {{2, 5, 6, 4}, {2, 5, 7, 4}, {2, 5, 7, 4}},
     .run = [](In x) { return outputs(at::scaled_dot_product_attention(x[0], x[1], x[2])); },
     .make_input = small_values,
     .placements = {queries, keys, keys},
     .two_d = true},
    {.name = "scaled_dot_product_attention_causal",
     .shapes = {{2, 5, 6, 4}, {2, 5, 6, 4}, {2, 5, 6, 4}},
     .run = [](In x) { return outputs(at::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, true)); },
     .make_input = small_values,
     .placements = {queries, keys, keys}},
    {.name = "scaled_dot_product_attention_mask_and_scale",
     .shapes = {{2, 5, 6, 4}, {2, 5, 7, 4}, {2, 5, 7, 4}, {6, 7}},
     .run = [](In x) { return outputs(at::scaled_dot_product_attention(x[0], x[1], x[2], x[3], 0.0, false, 0.3)); },
     .make_input = small_values,
     .placements = {queries, keys, keys, {Replicate(), Shard(0)}}},
});

}  // namespace
}  // namespace dtensor::testing
