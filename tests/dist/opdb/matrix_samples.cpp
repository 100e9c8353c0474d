// Samples for the matrix family; uneven sizes (5 rows, 7-long vectors) over 4 ranks.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

const bool matrix_samples_registered = add_op_samples({
    {"mm", {{5, 4}, {4, 6}}, [](In x) { return outputs(at::mm(x[0], x[1])); }, nullptr, {}, true, true},
    {"addmm", {{6}, {5, 4}, {4, 6}}, [](In x) { return outputs(at::addmm(x[0], x[1], x[2], 0.5, 2)); }},
    {"addmm_2d_bias", {{5, 6}, {5, 4}, {4, 6}}, [](In x) { return outputs(at::addmm(x[0], x[1], x[2])); }},
    {"addmm_", {{5, 6}, {5, 4}, {4, 6}}, [](In x) { return outputs(x[0].clone().addmm_(x[1], x[2])); }},
    {"baddbmm_", {{3, 5, 6}, {3, 5, 4}, {3, 4, 6}}, [](In x) { return outputs(x[0].clone().baddbmm_(x[1], x[2])); }},
    {"bmm", {{3, 5, 4}, {3, 4, 6}}, [](In x) { return outputs(at::bmm(x[0], x[1])); }},
    {"baddbmm", {{3, 5, 6}, {3, 5, 4}, {3, 4, 6}}, [](In x) { return outputs(at::baddbmm(x[0], x[1], x[2])); }},
    {"dot", {{7}, {7}}, [](In x) { return outputs(at::dot(x[0], x[1])); }},
    {"mv", {{5, 4}, {4}}, [](In x) { return outputs(at::mv(x[0], x[1])); }},
    // matmul and einsum decompose (into mm / bmm, expand, view and permutes): broadcast batch dims.
    {"matmul_batched_broadcast", {{2, 3, 5, 4}, {4, 6}}, [](In x) { return outputs(at::matmul(x[0], x[1])); }},
    {"matmul_batched", {{3, 5, 4}, {3, 4, 6}}, [](In x) { return outputs(at::matmul(x[0], x[1])); }, nullptr, {}, true,
     true},
    {"einsum_attention_scores", {{2, 5, 4}, {2, 6, 4}}, [](In x) { return outputs(at::einsum("bik,bjk->bij", {x[0], x[1]})); }},
    {"einsum_outer", {{5}, {6}}, [](In x) { return outputs(at::einsum("i,j->ij", {x[0], x[1]})); }},
    {"linear", {{5, 4}, {6, 4}, {6}}, [](In x) { return outputs(at::linear(x[0], x[1], x[2])); }, nullptr, {}, true, true},
});

}  // namespace
}  // namespace dtensor::testing
