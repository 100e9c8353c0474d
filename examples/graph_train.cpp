// Training from an exported graph, expanded per rank (SPMD expansion, seed 001): the GPT's joint
// forward+backward program, exported from Python (torch.export.experimental._export_forward_backward),
// is expanded for DP2 x TP2 on 4 local ranks from the placements of its inputs alone (the batch
// sharded over dp, the weights by the tensor-parallel plan over tp). Each rank prints nothing but
// rank 0: the expanded step's collectives and why each is there, then 10 AdamW steps on every rank's
// own shards, their losses next to the same program trained in one process, and PASS.
//
//   graph_train [--model PATH] [--steps N]   (default PATH: the build's graph_models/gpt_joint.pt2)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include "build_paths.h"
#include "dtensor/dtensor.h"
#include "dtensor/graph/spmd.h"
#include "dtensor/graph/training.h"
#include "gpt/graph_plan.h"

namespace {

namespace g = dtensor::graph;

constexpr double kRelTolerance = 1e-4;

// Losses of `steps` AdamW steps on the same batch.
std::vector<double> train(g::Program& program, const std::vector<c10::IValue>& inputs, int steps) {
  torch::optim::AdamW adamw(g::joint_parameters(program), torch::optim::AdamWOptions(1e-2));
  return g::train_steps(program, adamw, inputs, steps);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = std::string(dtensor::build_paths::graph_models) + "/gpt_joint.pt2";
  int steps = 10;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--model") model = argv[i + 1];
    if (std::string(argv[i]) == "--steps") steps = std::stoi(argv[i + 1]);
  }
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 4}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);
    const bool print = world->rank() == 0;
    auto mesh = dtensor::DeviceMesh::create(world, {2, 2}, {.dim_names = {"dp", "tp"}});

    g::Program whole = g::load_program(model);
    g::SpmdPlacements where;
    const dtensor::Placements batch = {dtensor::Shard(0), dtensor::Replicate()};
    where.user_inputs = {batch, batch};  // tokens, targets
    where.state = g::plan_placements(whole, *mesh, gpt::graph_plan(), {.tp_dim = "tp"});
    g::Program step = g::spmd_expand(g::load_program(model), mesh, where);
    if (print)
      std::cout << "SPMD expansion of " << model << " for DP2 x TP2 (" << step.graph.size() << " nodes per rank)\n"
                << "collectives of one training step, each with the node it serves and its cost:\n"
                << g::collectives_report(step) << "\n";

    // The exported batch: [8, 32] tokens of the 42-character vocabulary, next-token targets.
    const at::Tensor tokens = at::arange(8 * 33, at::kLong).mul(7).remainder(42).view({8, 33});
    const std::vector<c10::IValue> inputs = {tokens.narrow(1, 0, 32).contiguous(), tokens.narrow(1, 1, 32).contiguous()};
    const std::vector<double> expected = train(whole, inputs, steps);
    const std::vector<double> losses = train(step, g::local_user_inputs(step, inputs), steps);

    double worst = 0;
    for (int s = 0; s < steps; ++s) {
      const double rel = std::abs(losses[s] - expected[s]) / std::abs(expected[s]);
      worst = std::max(worst, rel);
      if (print) std::printf("step %2d  loss %.6f  one process %.6f  rel diff %.1e\n", s, losses[s], expected[s], rel);
    }
    const bool ok = worst <= kRelTolerance && losses.back() < losses.front();
    const int64_t failures = world->sum_across_ranks(ok ? 0 : 1);
    if (print)
      std::cout << (failures == 0 ? "PASS: every rank's loss trajectory equals the single-process program's (rel <= 1e-4)\n"
                                  : "FAIL: loss trajectories differ\n");
    return failures == 0 ? 0 : 1;
  });
}
