// Convolutional networks under tensor parallelism (the parallel styles on Conv, BatchNorm and
// EmbeddingBag): outputs, gradients and training steps against the same model on one device.

#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "dtensor/comm_debug.h"
#include "dtensor/parallel.h"
#include "harness.h"
#include "test_modules.h"

namespace dtensor::testing {
namespace {

// Conv2d(3, 7) -> BatchNorm2d -> ReLU -> Conv2d(7, 6) -> GroupNorm(3 groups) -> ReLU -> mean over the
// image -> Linear(6, 4). 7 hidden channels split unevenly over 2 and 4 ranks. The first conv has no
// bias, as usual before a batch norm: its gradient would be rounding noise, which Adam amplifies.
class SmallCnnImpl : public torch::nn::Module {
 public:
  SmallCnnImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 7, 3).padding(1).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(7))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(7, 6, 3).padding(1)))),
        gn(register_module("gn", torch::nn::GroupNorm(3, 6))),
        head(register_module("head", torch::nn::Linear(6, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = at::relu(call(bn, call(conv1, x)));
    return call(head, at::relu(call(gn, call(conv2, h))).mean({2, 3}));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn;
  torch::nn::Conv2d conv2;
  torch::nn::GroupNorm gn;
  torch::nn::Linear head;
};
TORCH_MODULE(SmallCnn);

// Megatron's pattern for convs: the first splits its output channels, the batch norm normalises the
// channels its rank holds, the second conv sums over its input channels (one all-reduce).
ParallelizePlan cnn_plan() {
  return {{"conv1", ColwiseParallel{.use_local_output = false}},
          {"bn", ColwiseParallel{.use_local_output = false}},
          {"conv2", RowwiseParallel{.use_local_output = false}}};
}

// Tensor parallel over "tp"; on a 2-d mesh data parallel over "dp" too: every other parameter and
// buffer Replicate, the batch split over dp.
void parallelize_cnn(SmallCnn& model, const MeshPtr& m) {
  parallelize_module(*model, m, cnn_plan(), {.tp_dim = m->ndim() > 1 ? "tp" : ""});
  distribute_module(*model, m);
}

// The batch laid out for the parallel model: Shard(0) over dp, Replicate over tp.
at::Tensor batch_on(const at::Tensor& t, const MeshPtr& m) {
  Placements placements(m->ndim(), Replicate());
  if (m->ndim() > 1) placements[0] = Shard(0);
  return distribute_tensor(t, m, placements);
}

struct Batch {
  at::Tensor images;  // [5, 3, 6, 6]: 5 over dp = 2 is 3 and 2, so SyncBatchNorm weighs uneven counts
  at::Tensor labels;
};

Batch batch(int64_t step) {
  return {test_tensor({5, 3, 6, 6}, at::kDouble, 40 + step) / 4,
          at::arange(5, at::kLong).add_(step).remainder_(4)};
}

double loss_value(const at::Tensor& loss) {
  at::NoGradGuard no_grad;
  return (is_dtensor(loss) ? full_tensor(loss) : loss).item<double>();
}

// Every tensor of `parallel` (parameters and buffers, whole) equals the reference's.
void expect_state_equal(torch::nn::Module& parallel, torch::nn::Module& reference, double rtol, double atol) {
  at::NoGradGuard no_grad;
  const auto expected_params = reference.named_parameters();
  for (const auto& p : parallel.named_parameters())
    EXPECT_TRUE(tensors_close(full_tensor(p.value()), expected_params[p.key()], rtol, atol)) << p.key();
  const auto expected_buffers = reference.named_buffers();
  for (const auto& b : parallel.named_buffers()) {
    const at::Tensor value = full_tensor(b.value());
    if (at::isFloatingType(value.scalar_type()))
      EXPECT_TRUE(tensors_close(value, expected_buffers[b.key()], rtol, atol)) << b.key();
    else
      EXPECT_TRUE(tensors_equal(value, expected_buffers[b.key()])) << b.key();
  }
}

class CnnParallelTest : public DistTest, public ::testing::WithParamInterface<bool> {
 protected:
  MeshPtr parallel_mesh() { return GetParam() ? mesh({2, 2}, {}, {"dp", "tp"}) : mesh({4}, {}, {"tp"}); }
};

// SGD with momentum and weight decay, then AdamW: losses, parameters, running statistics and the eval
// output follow the single-device run in double precision.
TEST_P(CnnParallelTest, TrainingStepsFollowOneDevice) {
  auto m = parallel_mesh();
  auto reference = seeded<SmallCnn>(), parallel = seeded<SmallCnn>();
  parallelize_cnn(parallel, m);
  EXPECT_EQ(placements_of(parallel->bn->running_mean).back(), Shard(0));
  EXPECT_EQ(placements_of(parallel->conv2->weight).back(), Shard(1));

  auto sgd_options = torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01);
  auto adamw_options = torch::optim::AdamWOptions(0.01).weight_decay(0.01);
  torch::optim::SGD sgd(parallel->parameters(), sgd_options), sgd_ref(reference->parameters(), sgd_options);
  torch::optim::AdamW adamw(parallel->parameters(), adamw_options), adamw_ref(reference->parameters(), adamw_options);
  for (int64_t step = 0; step < 4; ++step) {
    torch::optim::Optimizer& optimizer = step < 2 ? static_cast<torch::optim::Optimizer&>(sgd) : adamw;
    torch::optim::Optimizer& optimizer_ref = step < 2 ? static_cast<torch::optim::Optimizer&>(sgd_ref) : adamw_ref;
    const Batch b = batch(step);
    optimizer.zero_grad();
    optimizer_ref.zero_grad();
    CommDebugMode forward;
    at::Tensor loss =
        torch::nn::functional::cross_entropy(call(parallel, batch_on(b.images, m)), batch_on(b.labels, m));
    // Nothing is gathered: the batch norm all-reduces its statistics over dp (SyncBatchNorm).
    EXPECT_EQ(forward.count("all-gather"), 0) << forward.summary();
    const at::Tensor loss_ref = torch::nn::functional::cross_entropy(call(reference, b.images), b.labels);
    EXPECT_NEAR(loss_value(loss), loss_ref.item<double>(), 1e-11 * std::abs(loss_ref.item<double>())) << "step " << step;
    loss.backward();
    loss_ref.backward();
    if (step == 0) expect_grads_equal(*parallel, *reference, 1e-10, 1e-12);
    optimizer.step();
    optimizer_ref.step();
  }
  expect_state_equal(*parallel, *reference, 1e-10, 1e-12);

  parallel->eval();
  reference->eval();
  const Batch b = batch(9);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(tensors_close(full_tensor(call(parallel, batch_on(b.images, m))), call(reference, b.images), 1e-10, 1e-12));
}

INSTANTIATE_TEST_SUITE_P(Meshes, CnnParallelTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "DP2xTP2" : "TP4"; });

class ParallelStyleCnnTest : public DistTest {};

// Tensor parallel alone: forward one all-reduce (after the row-parallel conv), backward one (the
// column-parallel conv's input gradient); the batch norm between needs none.
TEST_F(ParallelStyleCnnTest, ConvBatchNormConvCommunicatesLikeMegatronsMlp) {
  auto m = mesh({4});
  auto reference = seeded<SmallCnn>(), parallel = seeded<SmallCnn>();
  parallelize_cnn(parallel, m);
  const at::Tensor x = test_tensor({5, 3, 6, 6}, at::kDouble, 50).div_(4).requires_grad_();
  const at::Tensor x_ref = x.detach().clone().requires_grad_();
  CommDebugMode forward;
  at::Tensor y = call(parallel, x);
  EXPECT_EQ(forward.count("all-reduce"), 1) << forward.summary();
  EXPECT_EQ(forward.total_count(), 1) << forward.summary();
  const at::Tensor y_ref = call(reference, x_ref);
  EXPECT_TRUE(tensors_close(full_tensor(y), y_ref, 1e-10, 1e-12));
  CommDebugMode backward;
  y.pow(2).sum().backward();
  EXPECT_EQ(backward.count("all-reduce"), 1) << backward.summary();
  EXPECT_EQ(backward.total_count(), 1) << backward.summary();
  y_ref.pow(2).sum().backward();
  EXPECT_TRUE(tensors_close(x.grad(), x_ref.grad(), 1e-10, 1e-12));
  expect_grads_equal(*parallel, *reference);
}

// Conv1d layers with plain local activations between (use_local_output): the row-parallel conv reads
// its plain input as this rank's channels of in_channels = 7 (2, 2, 2, 1: uneven).
class ConvPairImpl : public torch::nn::Module {
 public:
  ConvPairImpl()
      : up(register_module("up", torch::nn::Conv1d(torch::nn::Conv1dOptions(5, 7, 3).padding(1)))),
        down(register_module("down", torch::nn::Conv1d(torch::nn::Conv1dOptions(7, 4, 3)))) {}
  at::Tensor forward(const at::Tensor& x) { return call(down, at::tanh(call(up, x))); }
  torch::nn::Conv1d up, down;
};
TORCH_MODULE(ConvPair);

TEST_F(ParallelStyleCnnTest, ColwiseThenRowwiseConv1dWithLocalActivations) {
  auto m = mesh({4});
  auto reference = seeded<ConvPair>(), parallel = seeded<ConvPair>();
  parallelize_module(*parallel, m, {{"up", ColwiseParallel{}}, {"down", RowwiseParallel{}}});
  EXPECT_EQ(placements_of(parallel->up->weight), (Placements{Shard(0)}));
  EXPECT_EQ(placements_of(parallel->down->bias), (Placements{Replicate()}));
  const at::Tensor x = test_tensor({3, 5, 8}, at::kDouble, 51) / 4;
  const at::Tensor y = call(parallel, x);
  EXPECT_FALSE(is_dtensor(y));
  const at::Tensor y_ref = call(reference, x);
  EXPECT_TRUE(tensors_close(y, y_ref, 1e-10, 1e-12));
  y.pow(2).sum().backward();
  y_ref.pow(2).sum().backward();
  expect_grads_equal(*parallel, *reference);
}

// EmbeddingBag over a vocabulary of 11 rows (3, 3, 3, 2 over 4 ranks): row-parallel masked bags add up
// in one all-reduce; column-parallel max bags need none.
torch::nn::EmbeddingBag seeded_bags(torch::nn::EmbeddingBagOptions options) {
  torch::manual_seed(12);
  torch::nn::EmbeddingBag bags(options);
  bags->to(at::kDouble);
  return bags;
}

const at::Tensor& bag_indices() {
  static const at::Tensor t = at::tensor({0, 10, 3, 7, 7, 2, 9, 5, 1}, at::kLong);
  return t;
}
const at::Tensor& bag_offsets() {
  static const at::Tensor t = at::tensor({0, 3, 3, 7}, at::kLong);  // one empty bag
  return t;
}

TEST_F(ParallelStyleCnnTest, RowwiseEmbeddingBagIsVocabularyParallel) {
  auto m = mesh({4});
  for (auto mode : {torch::nn::EmbeddingBagMode(torch::kSum), torch::nn::EmbeddingBagMode(torch::kMean)}) {
    const auto options = torch::nn::EmbeddingBagOptions(11, 6).mode(mode).padding_idx(7);
    auto reference = seeded_bags(options), parallel = seeded_bags(options);
    parallelize_module(*parallel, m, {{"", RowwiseParallel{}}});
    EXPECT_EQ(placements_of(parallel->weight), (Placements{Shard(0)}));
    CommDebugMode debug;
    const at::Tensor y = call(parallel, bag_indices(), bag_offsets());
    EXPECT_EQ(debug.count("all-reduce"), 1) << debug.summary();
    EXPECT_EQ(debug.total_count(), 1) << debug.summary();
    const at::Tensor y_ref = reference(bag_indices(), bag_offsets());
    EXPECT_TRUE(tensors_close(y, y_ref, 1e-12, 1e-12));
    y.pow(3).sum().backward();
    y_ref.pow(3).sum().backward();
    expect_grads_equal(*parallel, *reference);
  }
}

TEST_F(ParallelStyleCnnTest, ColwiseEmbeddingBagShardsTheEmbeddingDim) {
  auto m = mesh({4});
  const auto options = torch::nn::EmbeddingBagOptions(11, 7).mode(torch::kMax);
  auto reference = seeded_bags(options), parallel = seeded_bags(options);
  parallelize_module(*parallel, m, {{"", ColwiseParallel{.use_local_output = false}}});
  EXPECT_EQ(placements_of(parallel->weight), (Placements{Shard(1)}));
  CommDebugMode debug;
  const at::Tensor y = call(parallel, bag_indices(), bag_offsets());
  EXPECT_EQ(debug.total_count(), 0) << debug.summary();
  EXPECT_EQ(placements_of(y), (Placements{Shard(1)}));
  const at::Tensor y_ref = reference(bag_indices(), bag_offsets());
  EXPECT_TRUE(tensors_close(full_tensor(y), y_ref, 1e-12, 1e-12));
  y.sum().backward();
  y_ref.sum().backward();
  expect_grads_equal(*parallel, *reference);
}

TEST_F(ParallelStyleCnnTest, ParallelStylesOnConvNetsSayWhatTheyDoNotSupport) {
  auto m = mesh({4});
  auto bags = seeded_bags(torch::nn::EmbeddingBagOptions(11, 6));
  EXPECT_THAT(error_of([&] { parallelize_module(*bags, m, {{"", RowwiseParallel{.input_layout = Shard(0)}}}); }),
              ::testing::HasSubstr("an EmbeddingBag's indices and offsets are read as Replicate"));
  torch::nn::GroupNorm norm(3, 6);
  EXPECT_THAT(error_of([&] { parallelize_module(*norm, m, {{"", RowwiseParallel{}}}); }),
              ::testing::HasSubstr("RowwiseParallel supports torch::nn::Linear, Conv1d/2d/3d, Embedding and "
                                   "EmbeddingBag; '' is a torch::nn::GroupNorm"));
}

}  // namespace
}  // namespace dtensor::testing
