// Samples for the view family.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

const bool registered = add_op_samples({
    {"t", {{5, 3}}, [](In x) { return outputs(x[0].t() * 1); }, nullptr, {}, true, true},
    {"transpose", {{2, 5, 3}}, [](In x) { return outputs(x[0].transpose(0, 2) * 1); }},
    {"permute", {{2, 5, 3}}, [](In x) { return outputs(x[0].permute({2, 0, 1}) * 1); }},
    {"detach", {{5, 3}}, [](In x) { return outputs(x[0].detach() * 1); }, nullptr, {}, false},
    {"alias", {{5, 3}}, [](In x) { return outputs(at::alias(x[0]) * 1); }},
    {"expand", {{5, 1}}, [](In x) { return outputs(x[0].expand({5, 4}) * 1); }},
    {"expand_new_dims", {{3}}, [](In x) { return outputs(x[0].expand({2, 5, 3}) * 1); }},
});

}  // namespace
}  // namespace dtensor::testing
