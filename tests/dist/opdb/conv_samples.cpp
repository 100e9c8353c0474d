// Samples for the convolution family: conv1d/2d/3d and a transposed conv, uneven over 4 ranks (batch
// 5: 2, 2, 1, 0; 5 input channels: 2, 2, 1, 0, so one rank convolves no channels; 7 output channels:
// 2, 2, 2, 1), with and without bias, strides, padding and dilation; a grouped conv (batch sharding
// only). Their gradients run convolution_backward; its direct samples give it Partial gradients.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

at::Tensor bias_of(In x) { return x.size() > 2 ? x[2] : at::Tensor(); }

// conv2d runs every placement; the other samples shard one spatial / kernel dim of input and weight
// (redistributed the same way), to keep their combinations few.
OpSample conv(std::string name, std::vector<Shape> shapes, std::function<at::Tensor(In)> call, bool two_d = false,
              bool every_dim = false) {
  std::vector<std::vector<Placement>> placements;
  if (!every_dim)
    for (const Shape& shape : shapes) {
      placements.push_back({Replicate()});
      for (int64_t d = 0; d < std::min<int64_t>(3, static_cast<int64_t>(shape.size())); ++d)
        placements.back().push_back(Shard(d));
    }
  return {.name = std::move(name),
          .shapes = std::move(shapes),
          .run = [call](In x) { return outputs(call(x)); },
          .placements = std::move(placements),
          .two_d = two_d};
}

// convolution_backward(grad_output, input, weight, ...) called directly for a 2-d conv with padding 1:
// grad_output is also tried Partial (each gradient is linear in it), and so are input and weight.
OpSample conv_backward(std::string name, std::vector<bool> mask) {
  const std::vector<Placement> activations{Replicate(), Shard(0), Shard(1), Partial()};
  return {.name = std::move(name),
          .shapes = {{5, 7, 4, 4}, {5, 5, 4, 4}, {7, 5, 3, 3}},
          .run = [mask](In x) {
            const auto [gi, gw, gb] = at::convolution_backward(x[0], x[1], x[2], std::vector<int64_t>{7}, {1, 1},
                                                               {1, 1}, {1, 1}, false, {0, 0}, 1,
                                                               {mask[0], mask[1], mask[2]});
            std::vector<at::Tensor> out;
            for (const auto& g : {gi, gw, gb})
              if (g.defined()) out.push_back(g);
            return out;
          },
          .placements = {activations, activations, {Replicate(), Shard(0), Shard(1), Partial()}}};
}

const bool conv_samples_registered = add_op_samples({
    conv("conv2d", {{5, 5, 4, 4}, {7, 5, 3, 3}, {7}},
         [](In x) { return at::conv2d(x[0], x[1], bias_of(x), 1, 1); }, /*two_d=*/true, /*every_dim=*/true),
    conv("conv2d_no_bias_dilated", {{5, 5, 5, 5}, {7, 5, 2, 2}},
         [](In x) {
           const std::vector<int64_t> stride{1, 1}, padding{0, 0}, dilation{2, 2};
           return at::conv2d(x[0], x[1], at::Tensor(), stride, padding, dilation);
         }),
    conv("conv1d_strided", {{5, 5, 7}, {6, 5, 3}, {6}}, [](In x) { return at::conv1d(x[0], x[1], x[2], 2, 1); },
         /*two_d=*/true),
    conv("conv3d", {{3, 5, 3, 3, 3}, {6, 5, 2, 2, 2}, {6}}, [](In x) { return at::conv3d(x[0], x[1], x[2]); }),
    conv("conv_transpose2d", {{5, 5, 3, 3}, {5, 7, 3, 3}, {7}},
         [](In x) { return at::conv_transpose2d(x[0], x[1], x[2], 2, 1, 1); }),
    conv("conv2d_grouped", {{5, 6, 4, 4}, {4, 3, 3, 3}, {4}},
         [](In x) { return at::conv2d(x[0], x[1], x[2], 1, 1, 1, /*groups=*/2); }),
    conv_backward("convolution_backward", {true, true, true}),
    conv_backward("convolution_backward_weight_only", {false, true, false}),
});

}  // namespace
}  // namespace dtensor::testing
