// A pipeline whose middle stage dies mid-step: 4 ranks on Gloo run 1F1B over a stack of linear stages
// (PP=4, 8 microbatches); in its second step, rank 2 kills itself (SIGKILL) in the forward of stage 2,
// microbatch 3. The survivors must fail rather than hang, each naming its own stage, action and
// microbatch and the rank it lost; the ctest pipeline_peer_death_is_named checks what they print.

#include <ATen/ATen.h>
#include <dtensor/dtensor.h>
#include <dtensor/pipeline.h>

#include <csignal>
#include <cstdio>

int main(int argc, char** argv) {
  return dtensor::run_local_ranks(argc, argv, {}, [](const std::shared_ptr<dtensor::World>& world) {
    namespace pp = dtensor::pipeline;
    const auto mesh = dtensor::DeviceMesh::create(world, {4}, {.dim_names = {"pp"}});
    const int rank = world->rank();
    at::manual_seed(rank);
    const at::Tensor weight = at::randn({6, 6}).requires_grad_(true);
    int step = 0, forwards = 0;  // forwards of this step: a stage runs its microbatches in order
    pp::PipelineStage stage{rank,
                            [&](const at::Tensor& x) {
                              if (rank == 2 && step == 2 && forwards++ == 3) std::raise(SIGKILL);
                              return at::tanh(at::matmul(x, weight));
                            },
                            {weight}};
    pp::PipelineRunner runner(pp::one_f_one_b(4, 8), {stage}, mesh, 0,
                              [](const at::Tensor& output, const at::Tensor& targets) { return at::mse_loss(output, targets); });
    const at::Tensor inputs = at::randn({16, 6}), targets = at::randn({16, 6});
    for (step = 1; step <= 3; ++step, forwards = 0) {
      runner.step(inputs, targets);
      std::printf("rank %d: step %d done\n", rank, step);
      std::fflush(stdout);
    }
    return 0;
  });
}
