// Samples for ops that make tensors from another's shape (empty_like is filled so it can be compared).

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

const bool factory_samples_registered = add_op_samples({
    {"zeros_like", {{5, 3}}, [](In x) { return outputs(at::zeros_like(x[0]) + x[0]); }},
    {"ones_like", {{5, 3}}, [](In x) { return outputs(at::ones_like(x[0]) * x[0]); }},
    {"full_like", {{5, 3}}, [](In x) { return outputs(at::full_like(x[0], 3.0) * x[0]); }},
    {"empty_like", {{5, 3}}, [](In x) { return outputs(at::empty_like(x[0]).fill_(2.0) * x[0]); }},
    {"new_zeros", {{5, 3}}, [](In x) { return outputs(x[0].new_zeros({4, 2})); }, nullptr, {}, false},
    {"new_ones", {{5, 3}}, [](In x) { return outputs(x[0].new_ones({4, 2})); }, nullptr, {}, false},
    {"new_full", {{5, 3}}, [](In x) { return outputs(x[0].new_full({4, 2}, 1.5)); }, nullptr, {}, false},
    {"new_empty", {{5, 3}}, [](In x) { return outputs(x[0].new_empty({4, 2}).fill_(1)); }, nullptr, {}, false},
    // Of the input's own shape: sharded like it, which the products with it show.
    {"new_zeros_same_shape", {{5, 3}}, [](In x) { return outputs(x[0].new_zeros({5, 3}) + x[0]); }},
    {"new_ones_same_shape", {{5, 3}}, [](In x) { return outputs(x[0].new_ones({5, 3}) * x[0]); }},
    {"new_full_same_shape", {{5, 3}}, [](In x) { return outputs(x[0].new_full({5, 3}, 1.5) * x[0]); }},
    {"new_empty_same_shape", {{5, 3}}, [](In x) { return outputs(x[0].new_empty({5, 3}).fill_(2) * x[0]); }},
});

}  // namespace
}  // namespace dtensor::testing
