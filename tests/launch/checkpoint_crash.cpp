// A rank killed in the middle of a save: the checkpoint saved before still loads and the unfinished one
// is refused.
//   checkpoint_crash save DIR      4 ranks save a sharded state into DIR (with DTENSOR_CHECKPOINT_FAULT=
//                                  kill-after-write:2, rank 2 dies by SIGKILL once its file is written)
//   checkpoint_crash check GOOD PARTIAL   loads GOOD (values checked) and prints PASS when PARTIAL is refused

#include <ATen/ATen.h>
#include <dtensor/checkpoint.h>
#include <dtensor/dtensor.h>

#include <cstdio>
#include <string>

namespace {

at::Tensor whole() { return at::arange(11 * 6, at::kFloat).reshape({11, 6}); }

dtensor::checkpoint::State sharded_state(const dtensor::MeshPtr& mesh, bool zeros) {
  const at::Tensor w = zeros ? at::zeros({11, 6}) : whole();
  return {{"w", dtensor::distribute_tensor(w, mesh, dtensor::Placements{dtensor::Shard(0)})},
          {"step", at::tensor(int64_t{zeros ? 0 : 7})}};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 2 ? argv[1] : "";
  if (mode != "save" && !(mode == "check" && argc > 3)) {
    std::fprintf(stderr, "usage: checkpoint_crash save DIR | check GOOD PARTIAL\n");
    return 2;
  }
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 4}, [&](const std::shared_ptr<dtensor::World>& world) {
    auto mesh = dtensor::DeviceMesh::create(world, {4});
    if (mode == "save") {
      dtensor::checkpoint::save(sharded_state(mesh, false), argv[2]);
      return 0;
    }
    auto state = sharded_state(mesh, true);
    dtensor::checkpoint::load(state, argv[2]);
    const bool good = at::equal(dtensor::full_tensor(state["w"]), whole()) && state["step"].item<int64_t>() == 7;
    std::string refusal = "none";
    try {
      dtensor::checkpoint::load(sharded_state(mesh, true), argv[3]);
    } catch (const dtensor::DTensorError& e) {
      refusal = e.what();
    }
    const bool refused = refusal.find("did not finish") != std::string::npos && refusal.find("no commit marker") != std::string::npos;
    std::printf("rank %d: previous checkpoint %s; unfinished one: %s\n", world->rank(), good ? "loads" : "WRONG",
                refusal.c_str());
    const bool pass = world->sum_across_ranks(good && refused ? 0 : 1) == 0;
    if (world->rank() == 0) std::printf(pass ? "PASS: the unfinished save is refused, the previous one loads\n" : "FAIL\n");
    return pass ? 0 : 1;
  });
}
