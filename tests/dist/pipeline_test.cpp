// Pipeline schedules run between real processes (dtensor/pipeline.h), on MPI and Gloo: a stack of
// layers split into uneven stages trains with every schedule (GPipe, 1F1B, Interleaved 1F1B,
// LoopedBFS, Interleaved Zero Bubble, ZBV) on 4 ranks, 1F1B on the pp dim of a 2x2 mesh, and 1F1B
// and ZBV with tensor-parallel stages on a (pp, tp) 2x2 mesh, over a batch the microbatches do not
// divide evenly, step after step, with batches of another size. The oracle is the whole model in one
// process on the same microbatches: every stage's gradients and the last stage's loss equal it.

#include <ATen/ATen.h>

#include <limits>

#include "dtensor/optim.h"
#include "dtensor/pipeline.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

using ::testing::HasSubstr;
namespace pp = dtensor::pipeline;

constexpr int kPipeLayers = 8;
constexpr int64_t kPipeWidth = 6, kPipeOut = 3, kPipeBatch = 21;  // 21 rows in 8 microbatches: 3 x5, 2 x3

// Layer l's weight and bias, the same on every rank; the last layer maps to the output width.
std::vector<at::Tensor> pipe_layer_parameters(int l) {
  const int64_t out = l == kPipeLayers - 1 ? kPipeOut : kPipeWidth;
  const at::Tensor w = at::sin(at::arange(out * kPipeWidth, at::kDouble).mul(0.37 * (l + 1))).reshape({out, kPipeWidth}).mul(0.6);
  const at::Tensor b = at::cos(at::arange(out, at::kDouble).mul(l + 1)).mul(0.1);
  return {w.requires_grad_(true), b.requires_grad_(true)};
}

at::Tensor pipe_layer(const std::vector<at::Tensor>& p, int l, const at::Tensor& x) {
  const at::Tensor y = at::linear(x, p[0], p[1]);
  return l == kPipeLayers - 1 ? y : at::tanh(y);
}

at::Tensor pipe_loss(const at::Tensor& output, const at::Tensor& targets) { return at::mse_loss(output, targets); }

// Layers [bounds[s], bounds[s + 1]) make stage s: uneven where the stages allow it.
std::vector<int> stage_bounds(int stages) {
  if (stages == 2) return {0, 3, 8};
  if (stages == 4) return {0, 1, 3, 6, 8};
  return {0, 1, 2, 3, 4, 5, 6, 7, 8};
}

// The layers, whole; or, given a `tp` mesh, tensor parallel inside each stage: every weight and bias
// Shard(0) over tp (each rank computes its rows of a layer's output; DTensor gathers them where the
// next layer needs them), the activations between stages plain tensors, whole on every tp rank.
struct PipeModel {
  std::vector<std::vector<at::Tensor>> layers;
  MeshPtr tp;
  explicit PipeModel(MeshPtr tp_mesh = nullptr) : tp(std::move(tp_mesh)) {
    for (int l = 0; l < kPipeLayers; ++l) {
      std::vector<at::Tensor> p = pipe_layer_parameters(l);
      if (tp)
        for (at::Tensor& t : p) t = distribute_tensor(t.detach(), tp, Placements{Shard(0)}).requires_grad_(true);
      layers.push_back(std::move(p));
    }
  }
  at::Tensor forward(int from, int to, at::Tensor x) const {
    if (tp) x = from_local(x, tp, {Replicate()});
    for (int l = from; l < to; ++l) x = pipe_layer(layers[l], l, x);
    return tp ? full_tensor(x) : x;
  }
  // A gradient as a whole tensor (a collective over tp for a DTensor one).
  static at::Tensor whole(const at::Tensor& grad) { return is_dtensor(grad) ? full_tensor(grad) : grad; }
};

at::Tensor pipe_inputs() { return at::cos(at::arange(kPipeBatch * kPipeWidth, at::kDouble).mul(0.11)).reshape({kPipeBatch, kPipeWidth}); }
at::Tensor pipe_targets() { return at::sin(at::arange(kPipeBatch * kPipeOut, at::kDouble).mul(0.23)).reshape({kPipeBatch, kPipeOut}); }

class PipelineTest : public DistTest {
 protected:
  // Runs `schedule` over `model`'s stages on `m`'s dim `dim` and checks gradients and loss against one
  // process running the whole model on the same microbatches (each microbatch's loss weighing 1/M).
  // With `tp`, each stage is tensor parallel over it (PipeModel).
  void expect_trains_as_one_process(const pp::Schedule& schedule, const MeshPtr& m, int64_t dim, const MeshPtr& tp = nullptr,
                                    const std::vector<int64_t>& batches = {kPipeBatch}) {
    const std::vector<int> bounds = stage_bounds(schedule.num_stages);
    PipeModel model(tp), oracle;
    const int rank = static_cast<int>(m->local_rank(dim));
    std::vector<pp::PipelineStage> stages;
    for (int s = 0; s < schedule.num_stages; ++s) {
      if (schedule.rank_of(s) != rank) continue;
      std::vector<at::Tensor> parameters;
      for (int l = bounds[s]; l < bounds[s + 1]; ++l) parameters.insert(parameters.end(), model.layers[l].begin(), model.layers[l].end());
      stages.push_back({s, [&model, from = bounds[s], to = bounds[s + 1]](const at::Tensor& x) { return model.forward(from, to, x); }, parameters});
    }
    pp::PipelineRunner runner(schedule, std::move(stages), m, dim, pipe_loss);
    for (const int64_t rows : batches) {
      SCOPED_TRACE("a step over " + std::to_string(rows) + " rows");
      for (auto* layers : {&model.layers, &oracle.layers})
        for (auto& layer : *layers)
          for (at::Tensor& p : layer) p.mutable_grad() = at::Tensor();
      const at::Tensor loss = runner.step(pipe_inputs().narrow(0, 0, rows), pipe_targets().narrow(0, 0, rows));

      const auto inputs = at::tensor_split(pipe_inputs().narrow(0, 0, rows), schedule.num_microbatches);
      const auto targets = at::tensor_split(pipe_targets().narrow(0, 0, rows), schedule.num_microbatches);
      at::Tensor expected_loss = at::zeros({}, at::kDouble);
      for (size_t k = 0; k < inputs.size(); ++k) expected_loss = expected_loss + pipe_loss(oracle.forward(0, kPipeLayers, inputs[k]), targets[k]);
      expected_loss = expected_loss / schedule.num_microbatches;
      expected_loss.backward();

      EXPECT_EQ(loss.defined(), schedule.rank_of(schedule.num_stages - 1) == rank);
      if (loss.defined()) EXPECT_TRUE(at::allclose(loss, expected_loss, 1e-12, 1e-12)) << loss << " vs " << expected_loss;
      expect_gradients_equal(schedule, bounds, model, oracle, rank);
    }
  }

  static void expect_gradients_equal(const pp::Schedule& schedule, const std::vector<int>& bounds, const PipeModel& model,
                                     const PipeModel& oracle, int rank) {
    for (int s = 0; s < schedule.num_stages; ++s) {
      for (int l = bounds[s]; l < bounds[s + 1]; ++l) {
        for (size_t p = 0; p < 2; ++p) {
          const at::Tensor& grad = model.layers[l][p].grad();
          if (schedule.rank_of(s) != rank) {
            EXPECT_FALSE(grad.defined()) << "stage " << s << " ran on rank " << rank;
            continue;
          }
          ASSERT_TRUE(grad.defined()) << "stage " << s << " layer " << l;
          EXPECT_EQ(is_dtensor(grad), model.tp != nullptr) << "stage " << s << " layer " << l;
          EXPECT_TRUE(at::allclose(PipeModel::whole(grad), oracle.layers[l][p].grad(), 1e-10, 1e-12))
              << "stage " << s << " layer " << l << " parameter " << p;
        }
      }
    }
  }
};

TEST_F(PipelineTest, EveryScheduleTrainsAsOneProcess) {
  const MeshPtr m = mesh({4}, {}, {"pp"});
  const std::vector<std::pair<std::string, pp::Schedule>> schedules = {
      {"gpipe", pp::gpipe(4, 8)},
      {"1f1b", pp::one_f_one_b(4, 8)},
      {"interleaved_1f1b", pp::interleaved_1f1b(4, 2, 8)},
      {"looped_bfs", pp::looped_bfs(4, 2, 8)},
      {"interleaved_zero_bubble", pp::interleaved_zero_bubble(4, 2, 8)},
      {"zbv_zero_bubble", pp::zbv_zero_bubble(4, 8)},
      {"dual_pipe_v", pp::dual_pipe_v(4, 8)},
  };
  for (const auto& [name, schedule] : schedules) {
    SCOPED_TRACE(name);
    // Steps of one batch size, then of another: the transfers' sizes as agreed from the step before,
    // then changed (stage_mailbox.h).
    expect_trains_as_one_process(schedule, m, 0, nullptr, {kPipeBatch, kPipeBatch, 13, 13});
  }
}

TEST_F(PipelineTest, OneFOneBOnThePpDimOfA2dMesh) {
  const MeshPtr m = mesh({2, 2}, {}, {"pp", "dp"});
  expect_trains_as_one_process(pp::one_f_one_b(2, 4), m, 0);
}

TEST_F(PipelineTest, OneFOneBWithTensorParallelStagesOnA2x2Mesh) {
  // PP=2 x TP=2: each stage's layers sharded over tp, the stages' activations passed along pp.
  const MeshPtr m = mesh({2, 2}, {}, {"pp", "tp"});
  expect_trains_as_one_process(pp::one_f_one_b(2, 8), m, 0, (*m)["tp"]);
}

TEST_F(PipelineTest, ZeroBubbleWithTensorParallelStagesOnA2x2Mesh) {
  // The backward split in two (input gradients, then the DTensor parameters' gradients) under TP.
  const MeshPtr m = mesh({2, 2}, {}, {"pp", "tp"});
  expect_trains_as_one_process(pp::zbv_zero_bubble(2, 4), m, 0, (*m)["tp"]);
}

TEST_F(PipelineTest, ClipsByTheWholeModelsNormAcrossStages) {
  // Each pp rank holds its stages' gradients, plain and DTensors sharded over tp (uneven: 5 rows on 2
  // ranks); the oracle clips all of them, whole, together in one process. Both norms, 2 and infinity.
  const MeshPtr m = mesh({2, 2}, {}, {"pp", "tp"});
  const MeshPtr tp = (*m)["tp"];
  auto gradients_of = [&](int64_t rank, bool sharded) {
    std::vector<at::Tensor> params;
    for (int64_t k = 0; k <= rank + 1; ++k) {
      const at::Tensor grad = at::arange(3 + 2 * k, at::kDouble).add(rank - k).mul(0.7 - 0.4 * k);
      const bool distribute = sharded && k == 1;
      at::Tensor p = distribute ? distribute_tensor(at::zeros_like(grad), tp, Placements{Shard(0)}) : at::zeros_like(grad);
      p.requires_grad_(true);
      p.mutable_grad() = distribute ? distribute_tensor(grad, tp, Placements{Shard(0)}) : grad;
      params.push_back(p);
    }
    return params;
  };
  const int64_t rank = m->local_rank(0);
  for (const double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(norm_type);
    const std::vector<at::Tensor> mine = gradients_of(rank, true);
    const double norm = dtensor::clip_grad_norm_(mine, 1.5, norm_type, m, 0);
    std::vector<at::Tensor> all = gradients_of(0, false), other = gradients_of(1, false);
    const size_t first = all.size();
    all.insert(all.end(), other.begin(), other.end());
    const double expected = dtensor::clip_grad_norm_(all, 1.5, norm_type);
    EXPECT_NEAR(norm, expected, 1e-12);
    const std::vector<at::Tensor> clipped_here(all.begin() + (rank == 0 ? 0 : first), rank == 0 ? all.begin() + first : all.end());
    ASSERT_EQ(mine.size(), clipped_here.size());
    for (size_t i = 0; i < mine.size(); ++i)
      EXPECT_TRUE(at::allclose(PipeModel::whole(mine[i].grad()), clipped_here[i].grad(), 1e-14, 1e-14)) << i;
  }
}

// A failed step leaves transfers posted that would meet the next step's: the runner refuses to go on.
TEST_F(PipelineTest, AStepAfterAFailedOneIsRefused) {
  const MeshPtr m = mesh({1}, {world()->rank()}, {"pp"});
  bool fail = true;
  pp::PipelineStage stage{0, [&fail](const at::Tensor& x) {
                            if (fail) throw std::runtime_error("the stage's own error");
                            return x * 2;
                          },
                          {}};
  pp::PipelineRunner runner(pp::gpipe(1, 2), {stage}, m, 0, pipe_loss);
  EXPECT_THAT(error_of([&] { runner.step(pipe_inputs(), at::zeros({kPipeBatch, kPipeWidth}, at::kDouble)); }),
              HasSubstr("action 0F0 (stage 0, microbatch 0): the stage's own error"));
  fail = false;
  EXPECT_THAT(error_of([&] { runner.step(pipe_inputs(), at::zeros({kPipeBatch, kPipeWidth}, at::kDouble)); }),
              HasSubstr("an earlier step failed"));
}

TEST_F(PipelineTest, RefusesStagesAndBatchesThatDoNotFit) {
  const MeshPtr m = mesh({4}, {}, {"pp"});
  const int rank = static_cast<int>(m->local_rank(0));
  auto identity = [](const at::Tensor& x) { return x; };
  const pp::Schedule schedule = pp::one_f_one_b(4, 8);
  EXPECT_THAT(error_of([&] { pp::PipelineRunner(schedule, {{(rank + 1) % 4, identity, {}}}, m, 0, pipe_loss); }),
              HasSubstr("stage " + std::to_string((rank + 1) % 4) + " is not one the schedule places on pp rank " + std::to_string(rank)));
  EXPECT_THAT(error_of([&] { pp::PipelineRunner(schedule, {}, m, 0, pipe_loss); }),
              HasSubstr("places stage " + std::to_string(rank) + " on pp rank " + std::to_string(rank) + ", which was not given it"));
  EXPECT_THAT(error_of([&] { pp::PipelineRunner(pp::one_f_one_b(2, 8), {}, m, 0, pipe_loss); }),
              HasSubstr("the schedule is for 2 ranks, but the pp dim 0 of the mesh has 4"));
  pp::PipelineRunner runner(schedule, {{rank, identity, {}}}, m, 0, pipe_loss);
  EXPECT_THAT(error_of([&] { runner.step(at::ones({5, 2}), at::ones({5, 2})); }),
              HasSubstr("the batch of inputs has 5 rows along dim 0, too few for 8 microbatches"));
}

}  // namespace
}  // namespace dtensor::testing
