// FSDP2's controls of a fully-sharded module, each against the same GPT on one device (uneven rows over
// 4 ranks) and with the collectives it must (or must not) issue, on a 1-d mesh (FSDP=4) and two 2-d
// ones (HSDP, 2 replicas x FSDP=2; FSDP=2 x TP=2): set_reshard_after_backward, the explicit prefetch
// lists, unshard(async_op) and its handle, call_as_forward (register_fsdp_forward_method),
// CPUOffloadPolicy (on a CPU mesh: the identity), set_reshard_after_forward, set_gradient_divide_factor,
// set_requires_all_reduce (HSDP), set_unshard_in_backward, reset_iter_state and set_all_reduce_hook.
// Then the errors of misuse.

#include <cmath>
#include <limits>

#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include "dtensor/comm_debug.h"
#include "dtensor/fsdp.h"
#include "dtensor/optim.h"
#include "fsdp_gpt.h"
#include "harness.h"
#include "test_modules.h"

namespace dtensor::testing {
namespace {

struct FsdpLayout {
  const char* label;
  Shape shape;
  std::vector<std::string> names;
};

const FsdpLayout kFsdpLayouts[] = {
    {"FSDP=4", {4}, {"dp"}},
    {"HSDP 2 x FSDP=2", {2, 2}, {"replicate", "dp"}},
    {"FSDP=2 x TP=2", {2, 2}, {"dp", "tp"}},
};

// A fully-sharded GPT on one layout (tensor parallelism first on a "tp" dim), and the 1-d mesh over
// which the ranks hold their own rows of a batch.
struct Job {
  MeshPtr mesh;
  MeshPtr data;
  gpt::Gpt model;
};

Job sharded_job(const FsdpLayout& layout, int64_t layers = 2, const FullyShardOptions& options = {}) {
  Job job{mesh(layout.shape, {}, layout.names), nullptr, seeded_uneven_gpt(at::kDouble, layers)};
  const bool tp = layout.names.back() == "tp";
  if (tp) gpt::parallelize(job.model, (*job.mesh)["tp"]);
  gpt::fully_shard(job.model, job.mesh, options);
  job.data = tp ? (*job.mesh)["dp"] : layout.shape.size() == 1 ? job.mesh : mesh({4}, {}, {"data"});
  return job;
}

// Whether a parameter the module shows is gathered: a plain tensor, or with TP its TP shard (a DTensor
// on the TP mesh alone), not a shard over the FSDP mesh.
bool gathered(const at::Tensor& p, const MeshPtr& fsdp_mesh) { return !is_dtensor(p) || !same_mesh(mesh_of(p), fsdp_mesh); }

// Every parameter of `module` gathered, with the values of the same parameter of `reference`.
void expect_gathered(torch::nn::Module& module, torch::nn::Module& reference, const MeshPtr& fsdp_mesh) {
  const auto expected = reference.named_parameters();
  for (const auto& p : module.named_parameters()) {
    EXPECT_TRUE(gathered(p.value(), fsdp_mesh)) << p.key() << " is " << describe(p.value());
    EXPECT_TRUE(tensors_equal(whole(p.value()), expected[p.key()])) << p.key();
  }
}

void expect_sharded(torch::nn::Module& module, const MeshPtr& fsdp_mesh) {
  for (const auto& p : module.named_parameters()) EXPECT_FALSE(gathered(p.value(), fsdp_mesh)) << p.key();
}

// reshard on every fully-sharded module in `module` (unshard and reshard are not recursive).
void reshard_all(torch::nn::Module& module) {
  for (const auto& item : module.named_modules())
    if (is_fully_sharded(*item.value())) reshard(*item.value());
}

// The groups whose all-gathers `comm` saw, in order ("fully_shard(blocks.1)"); not tensor
// parallelism's (redistribute).
std::vector<std::string> gathers(const CommDebugMode& comm) {
  std::vector<std::string> out;
  for (const auto& c : comm.collectives())
    if (c.kind == "all-gather" && c.op.rfind("fully_shard(", 0) == 0) out.push_back(c.op);
  return out;
}

std::vector<std::string> labels(std::initializer_list<const char*> paths) {
  std::vector<std::string> out;
  for (const char* path : paths) out.push_back(std::string("fully_shard(") + path + ")");
  return out;
}

at::Tensor loss_on(gpt::Gpt& model, const gpt::Batch& batch) { return call(model, batch.tokens, batch.targets); }

// The rows of `t` (whole: [batch, ...]) that this rank holds in `job`.
at::Tensor my_rows(const at::Tensor& t, const Job& job) {
  const int64_t rows = t.size(0) / job.data->size(), r = (*job.data->coordinate())[0];
  return t.slice(0, r * rows, (r + 1) * rows);
}

class FsdpControlsTest : public DistTest {};

// set_reshard_after_backward(false), as FSDP2 uses it for gradient accumulation: after a micro-batch's
// backward every parameter is still gathered (whole, equal to one device's), and the next micro-batch's
// forward gathers nothing; its backward gathers the blocks only (they reshard after forward). The
// gradients accumulated over both equal one device's.
TEST_F(FsdpControlsTest, KeptAfterBackwardTheNextForwardGathersNothing) {
  for (const FsdpLayout& layout : kFsdpLayouts) {
    SCOPED_TRACE(layout.label);
    Job job = sharded_job(layout);
    auto reference = seeded_uneven_gpt();
    set_reshard_after_backward(*job.model, false);
    const int64_t layers = uneven_config().layers;
    const gpt::Batch first = batch_of(2), second = batch_of(3);
    set_requires_gradient_sync(*job.model, false);
    loss_on(job.model, dp_rows_of(first, job.data)).mul(0.5).backward();
    expect_gathered(*job.model, *reference, job.mesh);
    set_requires_gradient_sync(*job.model, true);
    CommDebugMode forward;
    at::Tensor loss = loss_on(job.model, dp_rows_of(second, job.data)).mul(0.5);
    EXPECT_EQ(forward.count("all-gather"), 0) << forward.summary();
    CommDebugMode backward;
    loss.backward();
    EXPECT_EQ(gathers(backward), labels({"blocks.1", "blocks.0"})) << backward.summary();
    EXPECT_EQ(backward.count("reduce-scatter"), layers + 1) << backward.summary();
    expect_gathered(*job.model, *reference, job.mesh);
    loss_on(reference, first).mul(0.5).backward();
    loss_on(reference, second).mul(0.5).backward();
    reshard_all(*job.model);  // the gradients are the sharded parameters'
    expect_grads_equal(*job.model, *reference, 1e-9, 1e-12);
  }
}

// Stepping while the parameters stay gathered (without the reshard PyTorch asks for first): the next
// forward sees the shards changed (the fused AdamW step among them) and gathers again, so training
// follows one device.
TEST_F(FsdpControlsTest, SteppingWhileKeptGatheredFollowsOneDevice) {
  for (const FsdpLayout& layout : kFsdpLayouts) {
    SCOPED_TRACE(layout.label);
    Job job = sharded_job(layout);
    auto reference = seeded_uneven_gpt();
    set_reshard_after_backward(*job.model, false);
    gpt::TrainOptions options;
    options.max_grad_norm = 0.5;
    auto optimizer = gpt::make_optimizer(job.model, options);  // the sharded parameters
    auto optimizer_ref = gpt::make_optimizer(reference, options);
    for (int64_t step = 0; step < 3; ++step) {
      const gpt::Batch batch = batch_of(step);
      optimizer.zero_grad();
      CommDebugMode comm;
      at::Tensor loss = loss_on(job.model, dp_rows_of(batch, job.data));
      // Every group again: its shards changed in the step.
      EXPECT_EQ(comm.count("all-gather"), uneven_config().layers + 1) << "step " << step;
      loss.backward();
      clip_grad_norm_(optimizer.param_groups().front().params(), options.max_grad_norm);
      step_on_local_shards(optimizer, {.fused = true});
      const double loss_ref = gpt::train_step(reference, optimizer_ref, batch, options);
      EXPECT_NEAR(gpt::mean_over(job.data, gpt::value_of(loss)), loss_ref, 1e-9 * std::abs(loss_ref)) << "step " << step;
    }
    reshard_all(*job.model);  // until then the module shows the values gathered before the last step
    expect_parameters_equal(job.model, reference, 1e-8, 1e-10);
  }
}

// Explicit prefetch lists on the root, four blocks: before the root's forward computes, blocks 3 and
// 1 are gathered in that order (block 2 then gathers at its own forward); before the root's backward,
// blocks 2 and 3. Each group still gathers once per pass, and training follows one device.
TEST_F(FsdpControlsTest, PrefetchListsOrderTheGathers) {
  for (const FsdpLayout& layout : kFsdpLayouts) {
    SCOPED_TRACE(layout.label);
    Job job = sharded_job(layout, /*layers=*/4);
    auto reference = seeded_uneven_gpt(at::kDouble, 4);
    const auto& blocks = *job.model->blocks;
    set_modules_to_forward_prefetch(*job.model, {blocks[3], blocks[1]});
    set_modules_to_backward_prefetch(*job.model, {blocks[2], blocks[3]});
    const gpt::Batch batch = batch_of(4);
    CommDebugMode forward;
    at::Tensor loss = loss_on(job.model, dp_rows_of(batch, job.data));
    const std::string root = gathers(forward).empty() ? "" : gathers(forward).front();
    EXPECT_EQ(root, "fully_shard(" + job.model->name() + ")");
    EXPECT_EQ(gathers(forward), labels({job.model->name().c_str(), "blocks.3", "blocks.1", "blocks.0", "blocks.2"}));
    CommDebugMode backward;
    loss.backward();
    EXPECT_EQ(gathers(backward), labels({"blocks.2", "blocks.3", "blocks.1", "blocks.0"}));
    loss_on(reference, batch).backward();
    expect_grads_equal(*job.model, *reference, 1e-9, 1e-12);
    // A block's list, with the implicit order recorded: block 0 fetches block 2 before block 1 runs.
    set_modules_to_forward_prefetch(*job.model, {});
    set_modules_to_forward_prefetch(*blocks[0], {blocks[2], blocks[1]});
    CommDebugMode again;
    loss_on(job.model, dp_rows_of(batch, job.data)).backward();
    const auto order = gathers(again);
    EXPECT_EQ(std::vector<std::string>(order.begin(), order.begin() + std::min<size_t>(5, order.size())),
              labels({job.model->name().c_str(), "blocks.0", "blocks.2", "blocks.1", "blocks.3"}));
    auto fresh = seeded_uneven_gpt(at::kDouble, 4);
    Job trained = sharded_job(layout, 4);
    set_modules_to_forward_prefetch(*trained.model, {(*trained.model->blocks)[1], (*trained.model->blocks)[2]});
    set_modules_to_backward_prefetch(*(*trained.model->blocks)[3], {(*trained.model->blocks)[1], (*trained.model->blocks)[2]});
    expect_training_follows_one_device(trained.model, fresh, trained.data);
  }
}

// unshard(async_op = true) starts the group's all-gather and returns: the parameters stay sharded
// until the handle's wait, which issues nothing more. Handles never waited for are taken by the
// forward (no second all-gather for their groups), and waiting afterwards does nothing.
TEST_F(FsdpControlsTest, AsyncUnshardStartsTheGatherAndTheForwardTakesIt) {
  for (const FsdpLayout& layout : kFsdpLayouts) {
    SCOPED_TRACE(layout.label);
    Job job = sharded_job(layout);
    auto reference = seeded_uneven_gpt();
    auto& block = *(*job.model->blocks)[1];
    CommDebugMode started;
    UnshardHandle handle = unshard(block, /*async_op=*/true);
    EXPECT_EQ(gathers(started), labels({"blocks.1"})) << started.summary();
    expect_sharded(block, job.mesh);
    CommDebugMode waited;
    handle.wait();
    handle.wait();
    EXPECT_EQ(waited.total_count(), 0) << waited.summary();
    expect_gathered(block, *(*reference->blocks)[1], job.mesh);
    reshard(block);
    expect_sharded(block, job.mesh);
    // The synchronous form: gathered on return, and an empty handle.
    unshard(block, /*async_op=*/false).wait();
    expect_gathered(block, *(*reference->blocks)[1], job.mesh);
    reshard(block);

    UnshardHandle root = unshard(*job.model, true), first = unshard(*(*job.model->blocks)[0], true);
    const gpt::Batch batch = batch_of(6);
    CommDebugMode forward;
    at::Tensor loss = loss_on(job.model, dp_rows_of(batch, job.data));
    EXPECT_EQ(gathers(forward), labels({"blocks.1"})) << forward.summary();
    loss.backward();
    CommDebugMode late;
    first.wait();
    root.wait();
    EXPECT_EQ(late.total_count(), 0) << late.summary();
    expect_sharded(*(*job.model->blocks)[0], job.mesh);
    EXPECT_NEAR(gpt::mean_over(job.data, gpt::value_of(loss)), loss_on(reference, batch).item<double>(), 1e-12);
    loss_on(reference, batch).backward();
    expect_grads_equal(*job.model, *reference, 1e-9, 1e-12);
  }
}

// A greedy generate: `steps` tokens appended, each the argmax of the logits at the last position.
at::Tensor generate(gpt::Gpt& model, at::Tensor tokens, int64_t steps) {
  for (int64_t i = 0; i < steps; ++i) {
    const at::Tensor logits = whole(model->logits(tokens));
    tokens = at::cat({tokens, logits.select(1, -1).argmax(-1, /*keepdim=*/true)}, 1);
  }
  return tokens;
}

// register_fsdp_forward_method's counterpart: the root's logits method (not its forward) run as its
// forward under grad (gradients equal one device's), and under no_grad a generate that calls it
// token by token and the module's own forward twice, the root gathered once for the whole call.
TEST_F(FsdpControlsTest, CallAsForwardRunsAnotherMethodWithTheParametersGathered) {
  for (const FsdpLayout& layout : kFsdpLayouts) {
    SCOPED_TRACE(layout.label);
    Job job = sharded_job(layout);
    auto reference = seeded_uneven_gpt();
    const int64_t layers = uneven_config().layers;
    const gpt::Batch batch = batch_of(7);
    const at::Tensor tokens = dp_rows_of(batch, job.data).tokens;
    CommDebugMode comm;
    const at::Tensor logits = call_as_forward(*job.model, [&] { return job.model->logits(tokens); });
    EXPECT_EQ(comm.count("all-gather"), layers + 1) << comm.summary();
    // Not fully sharded: call_as_forward just calls.
    const at::Tensor expected = call_as_forward(*reference, [&] { return reference->logits(batch.tokens); });
    EXPECT_TRUE(tensors_close(whole(logits), my_rows(expected, job), 1e-12, 1e-12));
    whole(logits).square().mean().backward();
    expected.square().mean().backward();
    expect_grads_equal(*job.model, *reference, 1e-9, 1e-12);

    at::NoGradGuard no_grad;
    const at::Tensor prompt = tokens.slice(1, 0, 5);
    CommDebugMode generating;
    const at::Tensor generated = call_as_forward(*job.model, [&](const at::Tensor& p) { return generate(job.model, p, 3); }, prompt);
    EXPECT_EQ(gathers(generating).size(), 1 + 3 * layers) << generating.summary();
    EXPECT_TRUE(tensors_equal(generated, my_rows(generate(reference, batch.tokens.slice(1, 0, 5), 3), job)));
    CommDebugMode nested;
    std::vector<at::Tensor> losses = call_as_forward(*job.model, [&] {
      return std::vector<at::Tensor>{loss_on(job.model, dp_rows_of(batch, job.data)), loss_on(job.model, dp_rows_of(batch_of(8), job.data))};
    });
    EXPECT_EQ(gathers(nested).size(), 1 + 2 * layers) << nested.summary();
    EXPECT_NEAR(gpt::mean_over(job.data, gpt::value_of(losses[1])), loss_on(reference, batch_of(8)).item<double>(), 1e-12);
    expect_sharded(*job.model, job.mesh);
    // A function with no result: the root's own parameters gathered while it runs, freed after.
    bool root_gathered = false;
    call_as_forward(*job.model, [&] { root_gathered = gathered(job.model->lm_head->weight, job.mesh); });
    EXPECT_TRUE(root_gathered);
    expect_sharded(*job.model, job.mesh);
    // A function that throws: freed again all the same.
    EXPECT_THROW(call_as_forward(*job.model, [] { throw std::runtime_error("fn failed"); }), std::runtime_error);
    expect_sharded(*job.model, job.mesh);
  }
}

// On a block (not the root): a lambda reading the block's parameters beside its forward, returning
// two outputs. The block is freed after it and gathered again before its backward, once.
TEST_F(FsdpControlsTest, CallAsForwardOnABlockGathersAgainForBackward) {
  for (const FsdpLayout& layout : kFsdpLayouts) {
    SCOPED_TRACE(layout.label);
    Job job = sharded_job(layout);
    auto reference = seeded_uneven_gpt();
    torch::manual_seed(11);
    const at::Tensor x = at::randn({8, 9, 12}, at::kDouble);
    const at::Tensor mask = reference->causal_mask;
    bool read_gathered = false;  // what the lambda saw of the block's parameters
    auto run = [&](gpt::Gpt& model, const at::Tensor& rows) {
      auto& block = *(*model->blocks)[1]->as<gpt::BlockImpl>();
      return call_as_forward(
          block,
          [&](const at::Tensor& h) {
            read_gathered = true;
            for (const auto& p : block.named_parameters()) read_gathered = read_gathered && gathered(p.value(), job.mesh);
            return std::vector<at::Tensor>{call(block, h, mask), whole(block.ln2->weight).mul(3)};
          },
          rows);
    };
    CommDebugMode forward;
    std::vector<at::Tensor> outputs = run(job.model, my_rows(x, job));
    EXPECT_TRUE(read_gathered);
    EXPECT_EQ(gathers(forward), labels({"blocks.1"})) << forward.summary();
    expect_sharded(*(*job.model->blocks)[1], job.mesh);
    CommDebugMode backward;
    (whole(outputs[0]).square().mean() + outputs[1].sum()).backward();
    EXPECT_EQ(gathers(backward), labels({"blocks.1"})) << backward.summary();
    const std::vector<at::Tensor> expected = run(reference, x);
    (expected[0].square().mean() + expected[1].sum()).backward();
    expect_grads_equal(*(*job.model->blocks)[1], *(*reference->blocks)[1], 1e-9, 1e-12);
  }
}

// CPUOffloadPolicy on a CPU mesh: accepted, said to be the identity (offloads_to_cpu), and training is
// bit for bit what it is without the policy, and follows one device.
TEST_F(FsdpControlsTest, CpuOffloadIsTheIdentityOnACpuMesh) {
  for (const FsdpLayout& layout : kFsdpLayouts) {
    SCOPED_TRACE(layout.label);
    for (const bool pin_memory : {true, false}) {
      Job offloaded = sharded_job(layout, 2, {.offload_policy = CPUOffloadPolicy{.pin_memory = pin_memory}});
      Job plain = sharded_job(layout);
      EXPECT_FALSE(offloads_to_cpu(*offloaded.model));
      EXPECT_FALSE(offloads_to_cpu(*(*offloaded.model->blocks)[0]));
      EXPECT_FALSE(offloads_to_cpu(*plain.model));
      auto reference = seeded_uneven_gpt();
      expect_training_follows_one_device(offloaded.model, reference, offloaded.data);
      auto again = seeded_uneven_gpt();
      expect_training_follows_one_device(plain.model, again, plain.data);
      const auto expected = plain.model->named_parameters();
      for (const auto& p : offloaded.model->named_parameters()) {
        EXPECT_TRUE(local_tensor_of(p.value()).device().is_cpu()) << p.key();
        EXPECT_TRUE(tensors_equal(local_tensor_of(p.value()), local_tensor_of(expected[p.key()]))) << p.key();
      }
    }
  }
}

// set_reshard_after_forward(root, true) frees the root's parameters after forward too (PyTorch's root
// obeys it once set): every parameter sharded after forward, the root gathered again first in
// backward. Then false on everything (recursive): nothing freed after forward, nothing gathered in
// backward; and on one block alone (recurse = false): only that block kept. Gradients equal one
// device's throughout.
TEST_F(FsdpControlsTest, SetReshardAfterForwardChangesItAfterFullyShardRootIncluded) {
  for (const FsdpLayout& layout : kFsdpLayouts) {
    SCOPED_TRACE(layout.label);
    Job job = sharded_job(layout);
    auto reference = seeded_uneven_gpt();
    const std::string root = job.model->name();
    const auto pass = [&](int64_t step, const std::vector<std::string>& backward_gathers) {
      const gpt::Batch batch = batch_of(step);
      at::Tensor loss = loss_on(job.model, dp_rows_of(batch, job.data));
      CommDebugMode backward;
      loss.backward();
      EXPECT_EQ(gathers(backward), backward_gathers) << "step " << step << ": " << backward.summary();
      loss_on(reference, batch).backward();
      expect_grads_equal(*job.model, *reference, 1e-9, 1e-12);
    };
    set_reshard_after_forward(*job.model, true);
    {
      at::Tensor loss = loss_on(job.model, dp_rows_of(batch_of(1), job.data));
      expect_sharded(*job.model, job.mesh);  // the root's own parameters included
    }
    reshard_all(*job.model);
    pass(2, labels({root.c_str(), "blocks.1", "blocks.0"}));
    set_reshard_after_forward(*job.model, false);
    pass(3, {});
    reshard_all(*job.model);
    set_reshard_after_forward(*job.model, true);
    set_reshard_after_forward(*(*job.model->blocks)[0], false, /*recurse=*/false);
    pass(4, labels({root.c_str(), "blocks.1"}));
  }
}

// set_gradient_divide_factor(3) on the root and block 1 (not recursive: block 0 keeps the average):
// their gradients are the sum over the data-parallel ranks (with HSDP, over the replicas too) of each
// rank's gradient, divided by 3; block 0's are one device's on the whole batch.
TEST_F(FsdpControlsTest, GradientDivideFactorSumsAndDivides) {
  for (const FsdpLayout& layout : kFsdpLayouts) {
    SCOPED_TRACE(layout.label);
    Job job = sharded_job(layout);
    auto summed = seeded_uneven_gpt(), averaged = seeded_uneven_gpt();
    set_gradient_divide_factor(*job.model, 3.0);
    set_gradient_divide_factor(*(*job.model->blocks)[1], 3.0);
    const gpt::Batch batch = batch_of(5);
    loss_on(job.model, dp_rows_of(batch, job.data)).backward();
    // The oracle: each data rank's loss on its rows, summed, divided by the factor.
    const int64_t ranks = job.data->size(), rows = batch.tokens.size(0) / ranks;
    at::Tensor sum = at::zeros({}, at::kDouble);
    for (int64_t r = 0; r < ranks; ++r)
      sum = sum + loss_on(summed, {batch.tokens.slice(0, r * rows, (r + 1) * rows), batch.targets.slice(0, r * rows, (r + 1) * rows)});
    sum.div(3.0).backward();
    loss_on(averaged, batch).backward();
    const auto expected_sum = summed->named_parameters(), expected_mean = averaged->named_parameters();
    for (const auto& p : job.model->named_parameters()) {
      const bool block0 = p.key().rfind("blocks.0.", 0) == 0;
      const at::Tensor& expected = (block0 ? expected_mean : expected_sum)[p.key()].grad();
      EXPECT_TRUE(tensors_close(full_tensor(p.value().grad()), expected, 1e-9, 1e-12)) << p.key();
    }
  }
}

// set_requires_all_reduce(false) on HSDP: the first micro-batch's backward reduce-scatters over dp and
// all-reduces nothing, the gradients left undefined; the second's (true) all-reduces each group once,
// and the gradients equal one device's accumulated over both. On FSDP=4 (no replicas) it changes
// nothing, as in PyTorch: the first backward sets the gradients already.
TEST_F(FsdpControlsTest, RequiresAllReduceFalseAccumulatesReducedShardsForOneAllReduce) {
  for (const FsdpLayout* layout : {&kFsdpLayouts[1], &kFsdpLayouts[0]}) {
    SCOPED_TRACE(layout->label);
    const bool hsdp = layout->names.front() == "replicate";
    Job job = sharded_job(*layout);
    auto reference = seeded_uneven_gpt();
    const int64_t groups = uneven_config().layers + 1;
    const gpt::Batch first = batch_of(8), second = batch_of(9);
    set_requires_all_reduce(*job.model, false);
    at::Tensor loss = loss_on(job.model, dp_rows_of(first, job.data)).mul(0.5);
    CommDebugMode held;
    loss.backward();
    EXPECT_EQ(held.count("reduce-scatter"), groups) << held.summary();
    EXPECT_EQ(held.count("all-reduce"), 0) << held.summary();
    EXPECT_EQ(job.model->lm_head->weight.grad().defined(), !hsdp);
    set_requires_all_reduce(*job.model, true);
    loss = loss_on(job.model, dp_rows_of(second, job.data)).mul(0.5);
    CommDebugMode reduced;
    loss.backward();
    EXPECT_EQ(reduced.count("reduce-scatter"), groups) << reduced.summary();
    EXPECT_EQ(reduced.count("all-reduce"), hsdp ? groups : 0) << reduced.summary();
    loss_on(reference, first).mul(0.5).backward();
    loss_on(reference, second).mul(0.5).backward();
    expect_grads_equal(*job.model, *reference, 1e-9, 1e-12);
  }
}

// set_unshard_in_backward(false) on a fully-sharded token embedding (its backward needs the indices
// only): its backward gathers it neither itself nor as block 0's prefetch, and its gradients (and
// everything else's) still equal one device's. Without it the embedding is gathered last.
TEST_F(FsdpControlsTest, UnshardInBackwardFalseSkipsTheGatherBeforeBackward) {
  for (const FsdpLayout* layout : {&kFsdpLayouts[0], &kFsdpLayouts[1]}) {
    SCOPED_TRACE(layout->label);
    auto m = mesh(layout->shape, {}, layout->names);
    const MeshPtr data = layout->shape.size() == 1 ? m : mesh({4}, {}, {"data"});
    auto model = seeded_uneven_gpt();
    fully_shard(*model->tok_emb, m);
    gpt::fully_shard(model, m);
    auto reference = seeded_uneven_gpt();
    const auto pass = [&](int64_t step, const std::vector<std::string>& backward_gathers) {
      const gpt::Batch batch = batch_of(step);
      at::Tensor loss = loss_on(model, dp_rows_of(batch, data));
      CommDebugMode backward;
      loss.backward();
      EXPECT_EQ(gathers(backward), backward_gathers) << "step " << step << ": " << backward.summary();
      EXPECT_EQ(backward.count("reduce-scatter"), uneven_config().layers + 2) << backward.summary();
      loss_on(reference, batch).backward();
      expect_grads_equal(*model, *reference, 1e-9, 1e-12);
    };
    pass(1, labels({"blocks.1", "blocks.0", "tok_emb"}));
    set_unshard_in_backward(*model->tok_emb, false);
    pass(2, labels({"blocks.1", "blocks.0"}));
  }
}

// reset_iter_state after a forward that threw midway (a token out of the vocabulary, the root gathered):
// every parameter sharded again, and the gradients accumulated before without sync are dropped, so
// the next synced micro-batch's gradients equal one device's on that micro-batch alone.
TEST_F(FsdpControlsTest, ResetIterStateAfterAnAbortedForward) {
  for (const FsdpLayout* layout : {&kFsdpLayouts[0], &kFsdpLayouts[1]}) {
    SCOPED_TRACE(layout->label);
    Job job = sharded_job(*layout);
    auto reference = seeded_uneven_gpt();
    set_requires_gradient_sync(*job.model, false);
    loss_on(job.model, dp_rows_of(batch_of(1), job.data)).backward();
    gpt::Batch bad = dp_rows_of(batch_of(2), job.data);
    bad.tokens = bad.tokens.clone();
    bad.tokens.index_put_({0, 3}, 99);
    EXPECT_ANY_THROW(loss_on(job.model, bad));
    reset_iter_state(*job.model);
    expect_sharded(*job.model, job.mesh);
    set_requires_gradient_sync(*job.model, true);
    const gpt::Batch batch = batch_of(3);
    loss_on(job.model, dp_rows_of(batch, job.data)).backward();
    loss_on(reference, batch).backward();
    expect_grads_equal(*job.model, *reference, 1e-9, 1e-12);
  }
}

// set_all_reduce_hook on block 1: called once per backward with its reduced shards (after HSDP's
// all-reduce; with TP once more, with the parameters replicated over dp), which it doubles in place: block 1's gradients are twice one device's, the others'
// equal them. While set_requires_all_reduce(false) holds HSDP's shards back, it is not called.
TEST_F(FsdpControlsTest, AllReduceHookSeesAndChangesTheReducedShards) {
  for (const FsdpLayout& layout : kFsdpLayouts) {
    SCOPED_TRACE(layout.label);
    const bool hsdp = layout.names.front() == "replicate";
    Job job = sharded_job(layout);
    auto reference = seeded_uneven_gpt();
    int calls = 0;
    set_all_reduce_hook(*(*job.model->blocks)[1], [&calls](const at::Tensor& reduced) {
      ++calls;
      reduced.mul_(2);
    });
    if (hsdp) {
      set_requires_all_reduce(*job.model, false);
      loss_on(job.model, dp_rows_of(batch_of(4), job.data)).backward();
      EXPECT_EQ(calls, 0);
      set_requires_all_reduce(*job.model, true);
      loss_on(reference, batch_of(4)).backward();
    }
    const gpt::Batch batch = batch_of(5);
    loss_on(job.model, dp_rows_of(batch, job.data)).backward();
    // With TP, the block's biases that TP cuts on every dim are replicated over dp: a second buffer.
    EXPECT_EQ(calls, layout.names.back() == "tp" ? 2 : 1);
    loss_on(reference, batch).backward();
    const auto expected = reference->named_parameters();
    for (const auto& p : job.model->named_parameters()) {
      const double scale = p.key().rfind("blocks.1.", 0) == 0 ? 2.0 : 1.0;
      EXPECT_TRUE(tensors_close(full_tensor(p.value().grad()), expected[p.key()].grad() * scale, 1e-9, 1e-12)) << p.key();
    }
  }
}

class FsdpControlsErrorTest : public DistTest {};

TEST_F(FsdpControlsErrorTest, MisuseIsRefusedWithAClearError) {
  auto m = mesh({4}, {}, {"dp"});
  auto model = seeded_uneven_gpt(at::kDouble, 3);
  auto other = seeded_uneven_gpt();
  const auto& blocks = *model->blocks;
  for (int64_t i = 0; i < 2; ++i) fully_shard(*blocks[i], m);  // block 2 is not
  fully_shard(*model, m);
  gpt::fully_shard(other, m);
  const auto not_sharded = ::testing::HasSubstr("is not fully sharded (call fully_shard on it first)");
  EXPECT_THAT(error_of([&] { set_reshard_after_backward(*blocks[2], false); }), not_sharded);
  EXPECT_THAT(error_of([&] { set_modules_to_forward_prefetch(*blocks[2], {blocks[0]}); }), not_sharded);
  EXPECT_THAT(error_of([&] { unshard(*blocks[2], true); }), not_sharded);
  EXPECT_THAT(error_of([&] { offloads_to_cpu(*blocks[2]); }), not_sharded);
  EXPECT_THAT(error_of([&] { set_reshard_after_forward(*blocks[2], false); }),
              ::testing::AllOf(::testing::HasSubstr("set_reshard_after_forward: module"), not_sharded));
  EXPECT_THAT(error_of([&] { set_gradient_divide_factor(*blocks[2], 2.0); }), not_sharded);
  EXPECT_THAT(error_of([&] { set_requires_all_reduce(*blocks[2], false); }), not_sharded);
  EXPECT_THAT(error_of([&] { set_unshard_in_backward(*blocks[2], false); }), not_sharded);
  EXPECT_THAT(error_of([&] { reset_iter_state(*blocks[2]); }), not_sharded);
  EXPECT_THAT(error_of([&] { set_all_reduce_hook(*blocks[2], [](const at::Tensor&) {}); }), not_sharded);
  for (const double bad : {0.0, -4.0, std::nan(""), std::numeric_limits<double>::infinity()})
    EXPECT_THAT(error_of([&] { set_gradient_divide_factor(*blocks[1], bad); }),
                ::testing::AllOf(::testing::HasSubstr("set_gradient_divide_factor("), ::testing::HasSubstr("(fully_shard(blocks.1))"),
                                 ::testing::HasSubstr("give a positive finite number")));
  EXPECT_THAT(error_of([&] { set_modules_to_forward_prefetch(*model, {blocks[1], blocks[2]}); }),
              ::testing::AllOf(::testing::HasSubstr("set_modules_to_forward_prefetch"), ::testing::HasSubstr("entry 1, module"),
                               ::testing::HasSubstr("is not fully sharded: list only modules fully_shard was called on")));
  EXPECT_THAT(error_of([&] { set_modules_to_backward_prefetch(*blocks[0], {(*other->blocks)[1]}); }),
              ::testing::AllOf(::testing::HasSubstr("set_modules_to_backward_prefetch"), ::testing::HasSubstr("(fully_shard(blocks.0))"),
                               ::testing::HasSubstr("entry 0, module"), ::testing::HasSubstr("(fully_shard(blocks.1))"),
                               ::testing::HasSubstr("is not under the same fully-sharded root")));
  EXPECT_THAT(error_of([&] { set_modules_to_backward_prefetch(*model, {nullptr}); }), ::testing::HasSubstr("entry 0 of the list is null"));
  // Refused lists change nothing: the forward gathers in the implicit order.
  CommDebugMode comm;
  call(model, dp_rows_of(batch_of(0), m).tokens, dp_rows_of(batch_of(0), m).targets);
  EXPECT_EQ(gathers(comm), labels({model->name().c_str(), "blocks.0", "blocks.1"}));
}

}  // namespace
}  // namespace dtensor::testing
