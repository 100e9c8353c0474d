// Samples for binning: bucketize against sorted boundaries, histc over a fixed range and over the
// data's own range (which the shards agree on first).

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

// Values in (-1, 1); boundaries (input 1 of bucketize) sorted.
at::Tensor values_or_boundaries(size_t i, const Shape& shape) {
  const at::Tensor t = test_tensor(shape, at::kDouble, 950 + i).tanh();
  return i == 1 ? std::get<0>(t.sort()) : t;
}

const bool histogram_samples_registered = add_op_samples({
    {.name = "bucketize", .shapes = {{5, 3}, {6}}, .run = [](In x) { return outputs(at::bucketize(x[0], x[1])); },
     .make_input = values_or_boundaries, .two_d = true, .partial_inputs = false},
    {.name = "histc", .shapes = {{5, 3}}, .run = [](In x) { return outputs(at::histc(x[0], 4, -1, 1)); },
     .make_input = values_or_boundaries, .two_d = true},
    {.name = "histc_data_range", .shapes = {{5, 3}}, .run = [](In x) { return outputs(at::histc(x[0], 4)); },
     .make_input = values_or_boundaries},
});

}  // namespace
}  // namespace dtensor::testing
