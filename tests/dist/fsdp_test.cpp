// fully_shard on the main job's GPT: training steps, gradients, gradient accumulation and checkpoints
// against the same model trained on one device with the whole batch, on meshes whose sizes do not
// divide the parameters' rows; the collectives per group; and the errors of misuse.

#include <torch/optim/adamw.h>

#include "dtensor/comm_debug.h"
#include "dtensor/fsdp.h"
#include "dtensor/training_state.h"
#include "fsdp_gpt.h"
#include "gpt/training.h"
#include "harness.h"
#include "live_bytes_limit.h"
#include "test_modules.h"

namespace dtensor::testing {
namespace {

namespace fs = std::filesystem;

class FsdpTest : public DistTest {};

TEST_F(FsdpTest, ParametersBecomeRowShardsOfTheDataParallelMesh) {
  auto m = mesh({4}, {}, {"dp"});
  auto reference = seeded_uneven_gpt(), parallel = seeded_uneven_gpt();
  gpt::fully_shard(parallel, m);
  const auto expected = reference->named_parameters();
  for (const auto& p : parallel->named_parameters()) {
    ASSERT_TRUE(is_dtensor(p.value())) << p.key();
    EXPECT_EQ(placements_of(p.value()), Placements{Shard(0)}) << p.key();
    EXPECT_TRUE(p.value().is_leaf() && p.value().requires_grad()) << p.key();
    EXPECT_TRUE(tensors_equal(local_tensor_of(p.value()), expected_shard(expected[p.key()], m, {Shard(0)}))) << p.key();
  }
  EXPECT_TRUE(is_fully_sharded(*parallel) && is_fully_sharded(*parallel->blocks[0]));
  EXPECT_FALSE(is_fully_sharded(*parallel->blocks[0]->as<gpt::BlockImpl>()->attn));
  // The buffer (the causal mask) is left as it is.
  EXPECT_FALSE(is_dtensor(parallel->causal_mask));
}

// One all-gather per group before forward; a block's again before its backward (it was freed after its
// forward), none for the root (it stays gathered); one reduce-scatter per group.
TEST_F(FsdpTest, EachGroupGathersOnceAndReducesOnce) {
  auto m = mesh({4}, {}, {"dp"});
  auto parallel = seeded_uneven_gpt();
  gpt::fully_shard(parallel, m);
  const gpt::Batch batch = dp_rows_of(batch_of(0), m);
  const int64_t layers = uneven_config().layers;
  CommDebugMode forward;
  at::Tensor loss = call(parallel, batch.tokens, batch.targets);
  EXPECT_EQ(forward.count("all-gather"), layers + 1) << forward.summary();
  EXPECT_EQ(forward.total_count(), layers + 1) << forward.summary();
  for (const auto& p : parallel->blocks[0]->named_parameters()) EXPECT_TRUE(is_dtensor(p.value())) << p.key();
  CommDebugMode backward;
  loss.backward();
  EXPECT_EQ(backward.count("all-gather"), layers) << backward.summary();
  EXPECT_EQ(backward.count("reduce-scatter"), layers + 1) << backward.summary();
  EXPECT_EQ(backward.total_count(), 2 * layers + 1) << backward.summary();
  for (const auto& p : parallel->named_parameters()) {
    EXPECT_TRUE(is_dtensor(p.value())) << p.key();
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(placements_of(p.value().grad()), Placements{Shard(0)}) << p.key();
  }
}

TEST_F(FsdpTest, GradientsEqualOneDeviceWithAndWithoutReshardAfterForward) {
  for (const bool reshard_after_forward : {true, false}) {
    SCOPED_TRACE(reshard_after_forward);
    auto m = mesh({4}, {}, {"dp"});
    auto reference = seeded_uneven_gpt(), parallel = seeded_uneven_gpt();
    gpt::fully_shard(parallel, m, {.reshard_after_forward = reshard_after_forward});
    const gpt::Batch batch = batch_of(1);
    at::Tensor loss = call(parallel, dp_rows_of(batch, m).tokens, dp_rows_of(batch, m).targets);
    const at::Tensor loss_ref = call(reference, batch.tokens, batch.targets);
    EXPECT_NEAR(gpt::mean_over(m, loss.item<double>()), loss_ref.item<double>(), 1e-12);
    loss.backward();
    loss_ref.backward();
    expect_grads_equal(*parallel, *reference, 1e-9, 1e-12);
  }
}

// AdamW with the global-norm clip, three steps, on 4 ranks and on 3 (rows 13 = 5 + 5 + 3).
TEST_F(FsdpTest, TrainingStepsFollowOneDevice) {
  for (const int64_t ranks : {4, 3}) {
    SCOPED_TRACE(ranks);
    if (world()->rank() >= ranks) {
      mesh({ranks}, {}, {"dp"});  // every rank makes the same meshes in the same order
      continue;
    }
    auto m = mesh({ranks}, {}, {"dp"});
    auto reference = seeded_uneven_gpt(), parallel = seeded_uneven_gpt();
    gpt::fully_shard(parallel, m);
    expect_training_follows_one_device(parallel, reference, m);
  }
}

// FSDP=2 x TP=2: Megatron-style TP on mesh["tp"], then each rank's TP shard sharded over dp (along dim
// 1 for a column-parallel weight; its bias, sharded by TP on its only dim, stays replicated over dp).
TEST_F(FsdpTest, FullyShardedTimesTensorParallelFollowsOneDevice) {
  auto m = mesh({2, 2}, {}, {"dp", "tp"});
  auto reference = seeded_uneven_gpt(), parallel = seeded_uneven_gpt();
  gpt::parallelize(parallel, (*m)["tp"]);
  gpt::fully_shard(parallel, m);
  auto* fc1 = parallel->blocks[0]->as<gpt::BlockImpl>()->mlp->fc1.get();
  EXPECT_EQ(placements_of(fc1->weight), (Placements{Shard(1), Shard(0)}));
  EXPECT_EQ(placements_of(fc1->bias), (Placements{Replicate(), Shard(0)}));
  EXPECT_EQ(placements_of(parallel->blocks[0]->as<gpt::BlockImpl>()->ln1->weight), (Placements{Shard(0), Replicate()}));
  expect_training_follows_one_device(parallel, reference, (*m)["dp"]);
}

// HSDP, 2 replicas x FSDP=2: parameters sharded over dp (7 + 6 rows of 13) and replicated over the
// replicas; a group gathers over dp only, and its gradients are reduce-scattered over dp, then
// all-reduced over the replicas. Each of the 4 ranks trains on its own rows.
TEST_F(FsdpTest, HybridShardingFollowsOneDevice) {
  auto m = mesh({2, 2}, {}, {"replicate", "dp"});
  auto everyone = mesh({4}, {}, {"data"});  // rank r = replica * 2 + dp rank: whose rows, and the mean loss
  auto reference = seeded_uneven_gpt(), parallel = seeded_uneven_gpt();
  gpt::fully_shard(parallel, m);
  for (const auto& p : parallel->named_parameters()) EXPECT_EQ(placements_of(p.value()), (Placements{Replicate(), Shard(0)})) << p.key();
  {
    const gpt::Batch batch = dp_rows_of(batch_of(0), everyone);
    const int64_t layers = uneven_config().layers;
    CommDebugMode comm;
    call(parallel, batch.tokens, batch.targets).backward();
    EXPECT_EQ(comm.count("all-gather"), 2 * layers + 1) << comm.summary();
    EXPECT_EQ(comm.count("reduce-scatter"), layers + 1) << comm.summary();
    EXPECT_EQ(comm.count("all-reduce"), layers + 1) << comm.summary();
    EXPECT_EQ(comm.total_count(), 4 * layers + 3) << comm.summary();
  }
  expect_training_follows_one_device(parallel, reference, everyone);
}

// Replicas x FSDP x TP on a 3-d mesh, over 4 ranks one dim at a time: 2 replicas x TP=2 (dp of one
// rank), and FSDP=2 x TP=2 (one replica).
TEST_F(FsdpTest, ReplicasTimesFullyShardedTimesTensorParallelFollowsOneDevice) {
  for (const Shape& shape : {Shape{2, 1, 2}, Shape{1, 2, 2}}) {
    SCOPED_TRACE(shape[0]);
    auto m = mesh(shape, {}, {"replicate", "dp", "tp"});
    auto reference = seeded_uneven_gpt(), parallel = seeded_uneven_gpt();
    gpt::parallelize(parallel, (*m)["tp"]);
    gpt::fully_shard(parallel, m);
    auto* fc1 = parallel->blocks[0]->as<gpt::BlockImpl>()->mlp->fc1.get();
    EXPECT_EQ(placements_of(fc1->weight), (Placements{Replicate(), Shard(1), Shard(0)}));
    EXPECT_EQ(placements_of(fc1->bias), (Placements{Replicate(), Replicate(), Shard(0)}));
    expect_training_follows_one_device(parallel, reference, (*m)[shape[0] > 1 ? "replicate" : "dp"]);
  }
}

// FSDP2's shard_placement_fn: every 2-d weight sharded along its last dim (fc2's 22 columns as
// 6 + 6 + 6 + 4), everything else along dim 0.
TEST_F(FsdpTest, ChosenShardDimsFollowOneDevice) {
  auto m = mesh({4}, {}, {"dp"});
  auto reference = seeded_uneven_gpt(), parallel = seeded_uneven_gpt();
  FullyShardOptions options;
  options.shard_dim = [](const std::string&, const at::Tensor& param) {
    return param.dim() == 2 ? std::optional<int64_t>(-1) : std::nullopt;
  };
  gpt::fully_shard(parallel, m, options);
  auto* fc2 = parallel->blocks[0]->as<gpt::BlockImpl>()->mlp->fc2.get();
  EXPECT_EQ(placements_of(fc2->weight), Placements{Shard(1)});
  EXPECT_EQ(local_tensor_of(fc2->weight).size(1), world()->rank() < 3 ? 6 : 4);
  EXPECT_EQ(placements_of(fc2->bias), Placements{Shard(0)});
  expect_training_follows_one_device(parallel, reference, m);
}

// The mixed-precision oracle, one process: fp32 master weights, and for each data-parallel rank's rows
// a bf16 copy of the model that runs forward and backward (its buffer, the causal mask, in bf16 too:
// the policy casts a block's floating inputs, the mask among them, to bf16); the bf16 gradients, cast
// to fp32 and averaged over the ranks' rows, are the master weights' gradients. That is what the policy
// {bf16 params, fp32 reduce} computes, step for step, so what differs is the order of the fp32 sums in
// the reduce-scatter.
double mixed_precision_step(gpt::Gpt& master, gpt::Gpt& compute, torch::optim::Optimizer& optimizer,
                            const gpt::Batch& batch, int64_t ranks, const gpt::TrainOptions& options) {
  optimizer.zero_grad();
  const auto masters = master->named_parameters();
  double loss = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    {
      at::NoGradGuard no_grad;
      for (auto& p : compute->named_parameters()) {
        p.value().set_data(masters[p.key()].to(at::kBFloat16));
        p.value().mutable_grad() = at::Tensor();
      }
    }
    const int64_t rows = batch.tokens.size(0) / ranks;
    at::Tensor l = call(compute, batch.tokens.slice(0, r * rows, (r + 1) * rows), batch.targets.slice(0, r * rows, (r + 1) * rows));
    l.backward();
    loss += l.item<double>() / static_cast<double>(ranks);
    at::NoGradGuard no_grad;
    for (auto& p : compute->named_parameters()) {
      at::Tensor& grad = masters[p.key()].mutable_grad();
      const at::Tensor share = p.value().grad().to(at::kFloat) / static_cast<double>(ranks);
      grad = grad.defined() ? grad + share : share;
    }
  }
  clip_grad_norm_(master->parameters(), options.max_grad_norm);
  optimizer.step();
  return loss;
}

// bf16 compute from fp32 shards, gradients reduced in fp32.
TEST_F(FsdpTest, MixedPrecisionFollowsOneProcessWithTheSamePolicy) {
  auto m = mesh({4}, {}, {"dp"});
  auto master = seeded_uneven_gpt(at::kFloat), compute = seeded_uneven_gpt(at::kBFloat16), parallel = seeded_uneven_gpt(at::kFloat);
  const FullyShardOptions policy{.mp_policy = {.param_dtype = at::kBFloat16, .reduce_dtype = at::kFloat}};
  gpt::fully_shard(parallel, m, policy);
  gpt::TrainOptions options;
  auto optimizer = gpt::make_optimizer(parallel, options);
  auto optimizer_ref = gpt::make_optimizer(master, options);
  for (int64_t step = 0; step < 3; ++step) {
    const gpt::Batch batch = batch_of(step);
    const double loss = gpt::mean_over(m, gpt::train_step(parallel, optimizer, dp_rows_of(batch, m), options));
    const double loss_ref = mixed_precision_step(master, compute, optimizer_ref, batch, 4, options);
    EXPECT_NEAR(loss, loss_ref, 1e-6 * std::abs(loss_ref)) << "step " << step;
  }
  for (const auto& p : parallel->parameters()) {
    EXPECT_EQ(p.scalar_type(), at::kFloat);
    EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
  }
  // fp32 sums in another order: a few fp32 ulps of the updates, not bf16's 2^-8.
  expect_parameters_equal(parallel, master, 1e-5, 1e-6);
}

// With overlap, from the second step on (the first records the order the groups run in), the next
// block's all-gather is in flight before the current block computes; after backward the last group's
// reduce-scatter is still in flight, and its gradients wait for it when read. Without overlap every
// collective completes where it is issued. Both train alike.
TEST_F(FsdpTest, OverlapPrefetchesTheNextGroupAndLeavesTheLastReductionInFlight) {
  auto m = mesh({4}, {}, {"dp"});
  std::vector<std::vector<double>> losses;
  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap);
    auto model = seeded_uneven_gpt();
    gpt::fully_shard(model, m, {.overlap = overlap});
    auto optimizer = gpt::make_optimizer(model, {});
    int64_t gathers_before_block0_computes = -1;
    auto* block0 = model->blocks[0]->as<gpt::BlockImpl>();
    losses.emplace_back();
    for (int64_t step = 0; step < 3; ++step) {
      const gpt::Batch batch = dp_rows_of(batch_of(step), m);
      CommDebugMode comm;
      register_forward_pre_hook(*block0->attn, [&](torch::nn::Module&, std::vector<at::Tensor>&) {
        gathers_before_block0_computes = comm.count("all-gather");
      });
      optimizer.zero_grad();
      at::Tensor loss = call(model, batch.tokens, batch.targets);
      remove_forward_hooks(*block0->attn);
      loss.backward();
      bool any_pending = false;
      for (const auto& p : model->parameters()) any_pending = any_pending || dtensor_impl(p.grad()).local_pending();
      EXPECT_EQ(any_pending, overlap) << "step " << step;
      // The root, then block 0, then (prefetched) block 1.
      EXPECT_EQ(gathers_before_block0_computes, overlap && step > 0 ? 3 : 2) << "step " << step;
      step_on_local_shards(optimizer);
      losses.back().push_back(gpt::mean_over(m, loss.item<double>()));
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
}

// Two micro-batches: the first without synchronisation (each rank keeps its whole gradients), the
// second reduces both at once; the same gradients as one device's over both micro-batches.
TEST_F(FsdpTest, GradientAccumulationWithoutSyncReducesOnce) {
  auto m = mesh({4}, {}, {"dp"});
  auto reference = seeded_uneven_gpt(), parallel = seeded_uneven_gpt();
  gpt::fully_shard(parallel, m);
  const gpt::Batch first = batch_of(2), second = batch_of(3);
  set_requires_gradient_sync(*parallel, false);
  CommDebugMode without_sync;
  call(parallel, dp_rows_of(first, m).tokens, dp_rows_of(first, m).targets).mul(0.5).backward();
  EXPECT_EQ(without_sync.count("reduce-scatter"), 0) << without_sync.summary();
  for (const auto& p : parallel->named_parameters()) EXPECT_FALSE(p.value().grad().defined()) << p.key();
  set_requires_gradient_sync(*parallel, true);
  CommDebugMode with_sync;
  call(parallel, dp_rows_of(second, m).tokens, dp_rows_of(second, m).targets).mul(0.5).backward();
  EXPECT_EQ(with_sync.count("reduce-scatter"), uneven_config().layers + 1) << with_sync.summary();
  call(reference, first.tokens, first.targets).mul(0.5).backward();
  call(reference, second.tokens, second.targets).mul(0.5).backward();
  expect_grads_equal(*parallel, *reference, 1e-9, 1e-12);
}

TEST_F(FsdpTest, UnshardGathersWholeParametersUntilReshard) {
  auto m = mesh({4}, {}, {"dp"});
  auto reference = seeded_uneven_gpt(), parallel = seeded_uneven_gpt();
  gpt::fully_shard(parallel, m);
  auto& block = *parallel->blocks[1];
  unshard(block);
  const auto expected = reference->blocks[1]->named_parameters();
  for (const auto& p : block.named_parameters()) {
    ASSERT_FALSE(is_dtensor(p.value())) << p.key();
    EXPECT_TRUE(tensors_equal(p.value(), expected[p.key()])) << p.key();
  }
  reshard(block);
  for (const auto& p : block.named_parameters()) EXPECT_TRUE(is_dtensor(p.value())) << p.key();
  // Forward under no_grad needs no backward: every group is sharded again afterwards.
  {
    at::NoGradGuard no_grad;
    const gpt::Batch batch = batch_of(4);
    const double loss = gpt::mean_over(m, call(parallel, dp_rows_of(batch, m).tokens, dp_rows_of(batch, m).targets).item<double>());
    EXPECT_NEAR(loss, call(reference, batch.tokens, batch.targets).item<double>(), 1e-12);
  }
  for (const auto& p : parallel->named_parameters()) EXPECT_TRUE(is_dtensor(p.value())) << p.key();
}

// Saved from FSDP=4 (parameters and AdamW state after two steps), loaded into TP=4, into one process,
// into FSDP=2 x TP=2 and into 2 replicas x FSDP=2 (saved again from each); saved again from TP=4 and
// loaded into a fresh FSDP=4 job: every tensor bit for bit.
TEST_F(FsdpTest, CheckpointsMoveBetweenFsdpTensorParallelAndOneProcess) {
  namespace ckpt = dtensor::checkpoint;
  const fs::path root = shared_directory("fsdp");
  auto m = mesh({4}, {}, {"dp"});
  gpt::TrainOptions options;
  auto source = seeded_uneven_gpt(at::kFloat);
  gpt::fully_shard(source, m);
  auto source_optimizer = gpt::make_optimizer(source, options);
  ckpt::TrainingState saved(*source, &source_optimizer);
  for (int64_t step = 0; step < 2; ++step) {
    const gpt::Batch batch = batch_of(step);
    gpt::train_step(source, source_optimizer, dp_rows_of(batch, m), options);
  }
  saved.save((root / "fsdp").string());

  // The optimizer lives on the heap: the TrainingState keeps its address.
  struct Job {
    std::unique_ptr<torch::optim::AdamW> optimizer;
    std::unique_ptr<ckpt::TrainingState> state;
  };
  auto load_into = [&](gpt::Gpt& model, const std::string& dir) {
    Job job;
    job.optimizer = std::make_unique<torch::optim::AdamW>(gpt::make_optimizer(model, options));
    job.state = std::make_unique<ckpt::TrainingState>(*model, job.optimizer.get());
    const ckpt::LoadResult result = job.state->load((root / dir).string(), {.world = world()});
    EXPECT_TRUE(result.missing.empty() && result.unexpected.empty()) << dir;
    return job;
  };
  auto expect_same_contents = [&](const std::string& a, const std::string& b) {
    ckpt::State left, right;
    for (const auto& [name, info] : ckpt::contents((root / a).string())) {
      left[name] = at::zeros(info.shape, info.dtype);
      right[name] = at::zeros(info.shape, info.dtype);
    }
    ASSERT_EQ(left.size(), ckpt::contents((root / b).string()).size());
    ckpt::load(left, (root / a).string(), {.world = world()});
    ckpt::load(right, (root / b).string(), {.world = world()});
    for (const auto& [name, t] : left) EXPECT_TRUE(tensors_equal(right.at(name), t)) << a << " vs " << b << ": " << name;
  };

  torch::manual_seed(99);  // other initial values: only the load can make them equal
  gpt::Gpt tensor_parallel(uneven_config());
  gpt::parallelize(tensor_parallel, mesh({4}, {}, {"tp"}));
  const Job tp_job = load_into(tensor_parallel, "fsdp");
  tp_job.state->save((root / "tp").string());
  expect_same_contents("fsdp", "tp");

  torch::manual_seed(98);
  gpt::Gpt single(uneven_config());
  const Job single_job = load_into(single, "tp");
  const auto from_fsdp = source->named_parameters();
  for (const auto& p : single->named_parameters())
    EXPECT_TRUE(tensors_equal(p.value(), full_tensor(from_fsdp[p.key()]))) << p.key();

  torch::manual_seed(96);
  gpt::Gpt fsdp_tp(uneven_config());
  auto m2 = mesh({2, 2}, {}, {"dp", "tp"});
  gpt::parallelize(fsdp_tp, (*m2)["tp"]);
  gpt::fully_shard(fsdp_tp, m2);
  const Job fsdp_tp_job = load_into(fsdp_tp, "fsdp");
  fsdp_tp_job.state->save((root / "fsdp-tp").string());
  expect_same_contents("fsdp", "fsdp-tp");

  torch::manual_seed(95);
  gpt::Gpt hybrid(uneven_config());
  gpt::fully_shard(hybrid, mesh({2, 2}, {}, {"replicate", "dp"}));
  const Job hybrid_job = load_into(hybrid, "fsdp");
  hybrid_job.state->save((root / "hsdp").string());
  expect_same_contents("fsdp", "hsdp");

  torch::manual_seed(97);
  gpt::Gpt back(uneven_config());
  gpt::fully_shard(back, m);
  const Job back_job = load_into(back, "tp");
  back_job.state->save((root / "back").string());
  expect_same_contents("fsdp", "back");
}

int64_t bytes_of_parameters(torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const auto& p : module.parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  return bytes;
}

// Under a limit on live tensor bytes that the whole training state (parameters, gradients, AdamW's two
// moments) does not fit in, FSDP=4 trains; without fully_shard the same training runs out of memory.
// Each rank's peak stays within its quarter of the state, plus the activations one device saves for the
// rank's rows, plus some of the largest group: blocking, four (its gathered parameters and the
// all-gather's output while they are copied out of it, or in backward its whole gradients and the
// reduce-scatter's input, of which Gloo's reduce-scatter makes a copy of its own; and freed buffers
// kept for the next gather, fsdp_buffers.h, up to two); overlapped, two more (the next group's gathered
// parameters and all-gather output while this one computes). Measured: about 3 blocking, 1-2 overlapped.
TEST_F(FsdpTest, TrainsUnderAMemoryLimitTheWholeTrainingStateExceeds) {
  const gpt::Config config{.vocab = 13, .seq_len = 32, .dim = 256, .heads = 4, .layers = 8, .ffn = 1024};
  auto m = mesh({4}, {}, {"dp"});
  const gpt::Batch local = dp_rows_of(batch_of(0), m);
  torch::manual_seed(3);
  gpt::Gpt probe(config);
  const int64_t state = 4 * bytes_of_parameters(*probe), largest_group = bytes_of_parameters(*probe->blocks[0]);
  int64_t activations = 0;
  {
    LiveBytesLimit measure(std::numeric_limits<int64_t>::max());
    const at::Tensor loss = call(probe, local.tokens, local.targets);  // holds what backward needs
    activations = measure.live();
  }
  const int64_t limit = state / 2;
  const gpt::TrainOptions options;
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap" : "blocking");
    const int64_t bound = state / 4 + (overlap ? 6 : 4) * largest_group + activations;
    ASSERT_LT(bound, limit);
    int64_t peak = 0;
    {
      LiveBytesLimit budget(limit);
      torch::manual_seed(3);
      gpt::Gpt model(config);
      gpt::fully_shard(model, m, {.overlap = overlap});
      auto optimizer = gpt::make_optimizer(model, options);
      for (int step = 0; step < 2; ++step) gpt::train_step(model, optimizer, local, options);
      peak = budget.peak();
    }
    EXPECT_LE(peak, bound);
    if (world()->rank() == 0)
      std::printf("[ fsdp memory ] %s: training state %.1f MiB, limit %.1f MiB; peak per rank %.1f MiB = state/4 %.1f + "
                  "%.2f x largest group (%.1f MiB) + activations %.2f MiB\n",
                  overlap ? "overlap" : "blocking", state / 1048576.0, limit / 1048576.0, peak / 1048576.0,
                  state / 4 / 1048576.0, static_cast<double>(peak - state / 4 - activations) / static_cast<double>(largest_group),
                  largest_group / 1048576.0, activations / 1048576.0);
  }
  LiveBytesLimit budget(limit);
  torch::manual_seed(3);
  gpt::Gpt model(config);
  auto optimizer = gpt::make_optimizer(model, options);
  EXPECT_THROW(for (int step = 0; step < 2; ++step) gpt::train_step(model, optimizer, local, options), c10::OutOfMemoryError);
}

class FsdpErrorTest : public DistTest {};

TEST_F(FsdpErrorTest, MisuseIsRefusedWithAClearError) {
  auto m = mesh({4}, {}, {"dp"});
  {
    auto model = seeded_uneven_gpt();
    fully_shard(*model->blocks[0], m);
    EXPECT_THAT(error_of([&] { fully_shard(*model->blocks[0], m); }), ::testing::HasSubstr("fully sharded already"));
  }
  {
    auto model = seeded_uneven_gpt();
    EXPECT_THAT(error_of([&] { fully_shard(*model, m, {.mp_policy = {.param_dtype = at::kInt}}); }),
                ::testing::AllOf(::testing::HasSubstr("param_dtype is Int"), ::testing::HasSubstr("not a floating-point")));
    EXPECT_THAT(error_of([&] { fully_shard(*model, m, {.mp_policy = {.reduce_dtype = at::kLong}}); }),
                ::testing::HasSubstr("reduce_dtype is Long"));
    EXPECT_THAT(error_of([&] { fully_shard(*model, mesh({2, 2}, {}, {"rows", "cols"})); }),
                ::testing::HasSubstr("has no dim named 'dp'"));
    // Three dims need one of them named for the replicas: two TP dims are not a layout fully_shard knows.
    EXPECT_THAT(error_of([&] { fully_shard(*model, mesh({1, 2, 2}, {}, {"rows", "dp", "tp"})); }),
                ::testing::HasSubstr("its replicas (a dim named 'replicate'"));
  }
  {
    // An optimizer made before fully_shard would step tensors the module no longer uses; nothing changes.
    auto model = seeded_uneven_gpt();
    auto optimizer = gpt::make_optimizer(model, {});
    EXPECT_THAT(error_of([&] { fully_shard(*model, m); }),
                ::testing::AllOf(::testing::HasSubstr("still referenced outside the module"),
                                 ::testing::HasSubstr("an optimizer made before fully_shard")));
    for (const auto& p : model->parameters()) EXPECT_FALSE(is_dtensor(p));
  }
  {
    // The LM head tied to the token embedding, which another group takes.
    auto model = seeded_uneven_gpt();
    model->lm_head->weight = model->tok_emb->weight;
    replace_parameter(*model->lm_head, "weight", model->tok_emb->weight, "lm_head.weight");
    EXPECT_THAT(error_of([&] { fully_shard(*model->lm_head, m); }),
                ::testing::HasSubstr("parameters shared across groups are not supported"));
    // Within one group a tied weight is one parameter.
    fully_shard(*model, m);
    EXPECT_TRUE(model->lm_head->weight.is_same(model->tok_emb->weight));
    EXPECT_TRUE(is_dtensor(model->tok_emb->weight));
  }
  {
    // An optimizer over the gathered parameters would step copies that the next forward replaces.
    // (Gathered under grad mode they are not leaves, and torch::optim refuses them itself.)
    auto model = seeded_uneven_gpt();
    gpt::fully_shard(model, m);
    {
      at::NoGradGuard no_grad;
      unshard(*model);
    }
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    reshard(*model);
    EXPECT_THAT(error_of([&] { step_on_local_shards(optimizer); }),
                ::testing::HasSubstr("gathered (unsharded) parameter of a fully-sharded module"));
  }
  {
    // A shard dim the parameter does not have, or one tensor parallelism shards already; nothing changes.
    auto model = seeded_uneven_gpt();
    const auto third = [](const std::string&, const at::Tensor&) -> std::optional<int64_t> { return 2; };
    EXPECT_THAT(error_of([&] { fully_shard(*model->blocks[0], m, {.shard_dim = third}); }),
                ::testing::HasSubstr("shard_dim chose dim 2 for parameter"));
    auto m2 = mesh({2, 2}, {}, {"dp", "tp"});
    gpt::parallelize(model, (*m2)["tp"]);
    const auto rows = [](const std::string&, const at::Tensor&) -> std::optional<int64_t> { return 0; };
    EXPECT_THAT(error_of([&] { fully_shard(*model->blocks[0], m2, {.shard_dim = rows}); }),
                ::testing::HasSubstr("which tensor parallelism shards already"));
    EXPECT_FALSE(is_fully_sharded(*model->blocks[0]));
  }
  EXPECT_THAT(error_of([&] { unshard(*seeded_uneven_gpt()); }), ::testing::HasSubstr("is not fully sharded"));
}

TEST_F(FsdpErrorTest, AMeshWithoutThisRankIsRefused) {
  auto m = mesh({2}, {0, 1}, {"dp"});
  auto model = seeded_uneven_gpt();
  if (world()->rank() < 2) {
    fully_shard(*model, m);
    EXPECT_TRUE(is_fully_sharded(*model));
  } else {
    EXPECT_THAT(error_of([&] { fully_shard(*model, m); }), ::testing::HasSubstr("does not hold this rank"));
  }
}

}  // namespace
}  // namespace dtensor::testing
