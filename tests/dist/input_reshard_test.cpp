// input_reshard: a tensor-parallel block recomputed in backward from its input, kept sharded in between,
// against one process (gradients of the parameters and of the input), dropout's draws included.

#include "dtensor/comm_debug.h"
#include "dtensor/parallel.h"
#include "test_modules.h"

namespace dtensor::testing {
namespace {

// TwoLayer with dropout between the layers (on the column-parallel output, a DTensor).
class DroppingTwoLayerImpl : public torch::nn::Module {
 public:
  DroppingTwoLayerImpl(int64_t dim, int64_t hidden)
      : up(register_module("up", torch::nn::Linear(dim, hidden))), down(register_module("down", torch::nn::Linear(hidden, dim))) {}
  at::Tensor forward(const at::Tensor& x) { return call(down, at::dropout(at::relu(call(up, x)), 0.5, /*train=*/true)); }
  torch::nn::Linear up, down;
};
TORCH_MODULE(DroppingTwoLayer);

const ParallelizePlan kPlan = {{"up", ColwiseParallel{}}, {"down", RowwiseParallel{}}};

class InputReshardTest : public DistTest {};

TEST_F(InputReshardTest, GradientsEqualOneProcessAndOnlyTheInputIsGatheredInBackward) {
  auto m = mesh({4});
  auto reference = seeded<TwoLayer>(6, 10), parallel = seeded<TwoLayer>(6, 10);
  parallelize_module(*parallel, m, kPlan);
  input_reshard(*parallel, m, 0);
  const at::Tensor x = test_tensor({7, 6}, at::kDouble, 41) / 4;  // 7 rows over 4 ranks: 2, 2, 2, 1
  const at::Tensor x_parallel = x.clone().requires_grad_(), x_reference = x.clone().requires_grad_();
  at::Tensor y;
  {
    CommDebugMode forward;
    y = call(parallel, x_parallel);
    EXPECT_EQ(forward.count("all-gather"), 0) << forward.summary();  // kept sharded: a local cut
  }
  CommDebugMode backward;
  y.pow(2).sum().backward();
  EXPECT_EQ(backward.count("all-gather"), 1) << backward.summary();  // the kept input, gathered back
  call(reference, x_reference).pow(2).sum().backward();
  expect_grads_equal(*parallel, *reference);
  EXPECT_TRUE(tensors_close(x_parallel.grad(), x_reference.grad(), 1e-10, 1e-12));
}

TEST_F(InputReshardTest, TheRecomputedForwardDrawsForwardsDropoutMask) {
  auto m = mesh({4});
  auto reference = seeded<DroppingTwoLayer>(6, 8), parallel = seeded<DroppingTwoLayer>(6, 8);
  // The column-parallel output stays a DTensor, so dropout draws LibTorch's whole mask (random.h).
  parallelize_module(*parallel, m, {{"up", ColwiseParallel{.use_local_output = false}}, {"down", RowwiseParallel{}}});
  input_reshard(*parallel, m, 0);
  const at::Tensor x = test_tensor({8, 6}, at::kDouble, 42) / 4;
  torch::manual_seed(5);
  call(parallel, x).pow(2).sum().backward();
  torch::manual_seed(5);
  call(reference, x).pow(2).sum().backward();
  expect_grads_equal(*parallel, *reference);
}

TEST_F(InputReshardTest, NoDimIsNothingAndBadMeshesAreRefused) {
  auto two_layer = seeded<TwoLayer>(6, 10);
  input_reshard(*two_layer, mesh({4}), std::nullopt);
  EXPECT_EQ(detail::forward_hooks_of(*two_layer), nullptr);
  EXPECT_THAT(error_of([&] { input_reshard(*two_layer, mesh({2, 2}), 0); }), ::testing::HasSubstr("give the 1-d tensor-parallel mesh"));
  input_reshard(*two_layer, mesh({4}), 0);
  EXPECT_THAT(error_of([&] { input_reshard(*two_layer, mesh({4}), 1); }), ::testing::HasSubstr("already has a forward wrapper"));
}

}  // namespace
}  // namespace dtensor::testing
