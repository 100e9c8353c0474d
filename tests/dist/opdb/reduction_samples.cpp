// Samples for the reduction family.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

const bool registered = add_op_samples({
    {"sum", {{5, 3}}, [](In x) { return outputs(x[0].sum()); }, nullptr, {}, true, true},
    {"sum_dim", {{5, 3}}, [](In x) { return outputs(x[0].sum(1)); }},
    {"sum_dim_keepdim", {{2, 5, 3}}, [](In x) { return outputs(x[0].sum({0, 2}, true)); }},
});

}  // namespace
}  // namespace dtensor::testing
