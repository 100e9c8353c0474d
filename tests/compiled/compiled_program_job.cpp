// Compiled per-rank programs end to end on 4 ranks (tests/compiled/compiled_programs.sh runs the steps):
//   compiled_program_job save DIR   each rank saves, with sample inputs, its TP=4 program of the exported
//                                   MLP (fc1 column-, fc2 row-parallel; DIR/programs/mlp_rank<r>.pt2) and of
//                                   the MLP's joint forward+backward expanded from the same plan
//                                   (DIR/programs/joint_rank<r>.pt2)
//   compiled_program_job run DIR    with DIR/compiled/ holding them compiled (scripts/compile_rank_programs.py
//                                   --threads 1): each rank runs the forward against the single-process
//                                   program on the whole input, trains 3 AdamW steps through the joint
//                                   package against the single-process program and the interpreted per-rank
//                                   one, then loads the packages it must refuse, each with its message
//   compiled_program_job saved DIR NAME...
//                                   for each NAME, the per-rank programs the graph tests saved
//                                   (DIR/saved/tp_NAME_rank<r>.pt2, tests/dist/graph/expect_saves.h) and
//                                   their packages (DIR/compiled/): each rank runs its package on the saved
//                                   sample inputs, and the program read back through the interpreter,
//                                   against what the interpreter computed when the test saved it
// The launching process prints "PASS" when every rank passed.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dtensor/dtensor.h>
#include <dtensor/graph/compiled_program.h>
#include <dtensor/graph/program.h>
#include <dtensor/graph/spmd.h>
#include <dtensor/graph/tensor_parallel.h>
#include <dtensor/graph/training.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "compiled/saved_rank_program.h"
#include "support/test_models.h"

namespace {

namespace g = dtensor::graph;

constexpr int kTrainingSteps = 3;

std::string rank_file(const std::string& dir, const std::string& model, int64_t rank) {
  return dir + "/" + model + "_rank" + std::to_string(rank) + ".pt2";
}

const dtensor::ParallelizePlan& mlp_plan() {
  static const dtensor::ParallelizePlan plan = {{"fc1", dtensor::ColwiseParallel{}}, {"fc2", dtensor::RowwiseParallel{}}};
  return plan;
}

g::Program expanded_joint(const dtensor::MeshPtr& mesh) {
  g::Program whole = g::load_program(dtensor::testing::graph_model("mlp_joint.pt2"));
  g::SpmdPlacements where;
  where.state = g::plan_placements(whole, *mesh, mlp_plan());
  return g::spmd_expand(std::move(whole), mesh, where);
}

std::vector<c10::IValue> joint_inputs() {
  const auto io = dtensor::testing::tensor_map("mlp_joint_io");
  return {io.at("input0"), io.at("input1")};
}

// The message of the DTensorError `load` throws, which must contain `expected`.
void expect_refused(const std::string& what, const std::string& expected, const std::function<void()>& load) {
  try {
    load();
  } catch (const dtensor::DTensorError& e) {
    if (std::string(e.what()).find(expected) == std::string::npos)
      throw std::runtime_error(what + ": the error does not say '" + expected + "': " + e.what());
    std::printf("refused (%s): %s\n", what.c_str(), e.what());
    return;
  }
  throw std::runtime_error(what + ": accepted");
}

int save(const dtensor::MeshPtr& mesh, const std::string& dir) {
  const int64_t rank = mesh->world()->rank();
  const at::Tensor input = dtensor::testing::tensor_map("mlp_io").at("input0");
  g::Program local = g::tensor_parallel_transform(g::load_program(dtensor::testing::graph_model("mlp.pt2")), mesh, mlp_plan());
  g::save_program(local, rank_file(dir + "/programs", "mlp", rank), {.sample_inputs = {input}});
  g::save_program(expanded_joint(mesh), rank_file(dir + "/programs", "joint", rank), {.sample_inputs = joint_inputs()});
  return 0;
}

// Three AdamW steps three ways: the single-process joint program, this rank's expanded program run by
// the interpreter, and its package computing with parameters of its own (use_state_of).
void check_training(const dtensor::MeshPtr& mesh, const std::string& dir) {
  using torch::optim::AdamW, torch::optim::AdamWOptions;
  const std::vector<c10::IValue> inputs = joint_inputs();
  g::Program whole = g::load_program(dtensor::testing::graph_model("mlp_joint.pt2"));
  g::Program interpreted = expanded_joint(mesh), compiled_state = expanded_joint(mesh);
  g::CompiledProgram compiled(rank_file(dir + "/compiled", "joint", mesh->world()->rank()), mesh);
  compiled.use_state_of(compiled_state);
  AdamW whole_adamw(g::joint_parameters(whole), AdamWOptions(1e-2));
  AdamW interpreted_adamw(g::joint_parameters(interpreted), AdamWOptions(1e-2));
  AdamW compiled_adamw(g::joint_parameters(compiled_state), AdamWOptions(1e-2));
  for (int step = 0; step < kTrainingSteps; ++step) {
    const double expected = g::joint_step(whole, inputs).item<double>();
    const double by_interpreter = g::joint_step(interpreted, inputs).item<double>();
    const double by_package =
        g::take_joint_outputs(compiled_state, compiled.run({inputs[0].toTensor(), inputs[1].toTensor()})).item<double>();
    whole_adamw.step();
    interpreted_adamw.step();
    compiled_adamw.step();
    for (const auto& [loss, by] : {std::pair{by_interpreter, "the interpreted per-rank program"}, std::pair{by_package, "the package"}})
      if (std::abs(loss - expected) > 1e-5 * std::abs(expected))
        throw std::runtime_error("training step " + std::to_string(step) + ": the loss by " + by + ", " + std::to_string(loss) +
                                 ", differs from the single-process program's " + std::to_string(expected));
  }
  const std::vector<at::Tensor> ours = g::joint_parameters(compiled_state), theirs = g::joint_parameters(interpreted);
  for (size_t i = 0; i < ours.size(); ++i)
    if (!at::allclose(ours[i], theirs[i], 1e-5, 1e-6)) throw std::runtime_error("after training, parameter " + std::to_string(i) + " differs from the interpreter's");
  std::printf("rank %ld: %d training steps through the compiled joint program equal the single-process program's\n",
              static_cast<long>(mesh->world()->rank()), kTrainingSteps);
}

int run(const std::shared_ptr<dtensor::World>& world, const dtensor::MeshPtr& mesh, const std::string& dir) {
  const int64_t rank = world->rank();
  const auto io = dtensor::testing::tensor_map("mlp_io");
  const at::Tensor input = io.at("input0");
  g::Program whole = g::load_program(dtensor::testing::graph_model("mlp.pt2"));
  const at::Tensor expected = g::run(whole, {input})[0].toTensor();
  if (!at::allclose(expected, io.at("output0"), 1e-5, 1e-6)) throw std::runtime_error("the interpreter differs from PyTorch's output");

  {
    g::CompiledProgram compiled(rank_file(dir + "/compiled", "mlp", rank), mesh);
    const std::vector<at::Tensor> out = compiled.run({input});
    if (out.size() != 1 || !at::allclose(out[0], expected, 1e-5, 1e-6))
      throw std::runtime_error("the compiled program's output differs from the single-process program's (max abs diff " +
                               std::to_string((out.at(0) - expected).abs().max().item<double>()) + ")");
    std::printf("rank %ld: compiled output equals the single-process program's\n", static_cast<long>(rank));
    expect_refused("an input of another dtype", "it was compiled for Float [", [&] { compiled.run({input.to(at::kDouble)}); });
  }

  check_training(mesh, dir);

  const std::string own = rank_file(dir + "/compiled", "mlp", rank);
  expect_refused("another rank's package", "compiled for rank " + std::to_string((rank + 1) % 4) + ", but this is rank " + std::to_string(rank),
                 [&] { g::CompiledProgram(rank_file(dir + "/compiled", "mlp", (rank + 1) % 4), mesh); });
  auto square = dtensor::DeviceMesh::create(world, {2, 2}, {.dim_names = {"dp", "tp"}});
  expect_refused("another mesh", "compiled for a mesh of shape [4], ranks [0, 1, 2, 3], dims [tp], but it was given shape [2, 2]",
                 [&] { g::CompiledProgram(own, square); });
  at::set_num_threads(2);
  expect_refused("another thread count", "compiled for 1 intra-op threads, but this process runs 2", [&] { g::CompiledProgram(own, mesh); });
  at::set_num_threads(1);
  expect_refused("a package from another machine", "instruction set extensions this one lacks (dtensor_test_only_isa",
                 [&] { g::CompiledProgram(rank_file(dir + "/other_machine", "mlp", rank), mesh); });
  expect_refused("a program that was not compiled", "not an AOTInductor package",
                 [&] { g::CompiledProgram(rank_file(dir + "/programs", "mlp", rank), mesh); });
  {
    g::CompiledProgram joint(rank_file(dir + "/compiled", "joint", rank), mesh);
    g::Program forward = g::load_program(dtensor::testing::graph_model("mlp.pt2"));  // whole weights, not this rank's
    expect_refused("the state of the whole program", "; it was compiled for Float [", [&] { joint.use_state_of(forward); });
    forward.state.clear();
    expect_refused("a program without that state", "which " + dtensor::testing::graph_model("mlp.pt2") + " has no state tensor for",
                   [&] { joint.use_state_of(forward); });
  }
  // The same mesh on the other backend: its process groups have other names than the package calls.
  const dtensor::CommBackend other = mesh->backend() == dtensor::CommBackend::Mpi ? dtensor::CommBackend::Gloo : dtensor::CommBackend::Mpi;
  if (other == dtensor::CommBackend::Mpi) throw std::runtime_error("run this job under mpirun (its missing-group case moves to Gloo)");
  auto on_gloo = dtensor::DeviceMesh::create(world, {4}, {.dim_names = {"tp"}, .backend = other});
  expect_refused("a process group missing at run time", "which this process does not have", [&] { g::CompiledProgram(own, on_gloo); });
  // No rank leaves while another may still be connecting its Gloo group to it (a peer that exited
  // closed the connection under rank 0's connectFullMesh once).
  world->sum_across_ranks(0);
  return 0;
}

// Each saved program's package and the program read back, against the interpreter's outputs at saving.
int check_saved(const std::shared_ptr<dtensor::World>& world, const std::string& dir, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    dtensor::testing::SavedRankProgram saved = dtensor::testing::load_saved_rank_program(world, dir + "/saved", dir + "/compiled", name);
    dtensor::testing::expect_equal_to_saved(saved, saved.compiled->run(saved.inputs), "the package");
    dtensor::testing::expect_equal_to_saved(saved, dtensor::testing::interpret(saved), "the interpreter on the program read back");
    std::printf("rank %ld: %s compiled equals the interpreter (%zu outputs)\n", static_cast<long>(world->rank()), name.c_str(),
                saved.expected.size());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 2 ? argv[1] : "";
  if (mode != "save" && mode != "run" && !(mode == "saved" && argc > 3)) {
    std::fprintf(stderr, "usage: compiled_program_job save|run DIR, or compiled_program_job saved DIR NAME...\n");
    return 2;
  }
  const std::string dir = argv[2];
  const std::vector<std::string> names(argv + std::min(argc, 3), argv + argc);
  const int rc = dtensor::run_local_ranks(argc, argv, {.nprocs = 4}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);
    if (mode == "saved") return check_saved(world, dir, names);
    auto mesh = dtensor::DeviceMesh::create(world, {4}, {.dim_names = {"tp"}});
    return mode == "save" ? save(mesh, dir) : run(world, mesh, dir);
  });
  if (rc == 0 && !dtensor::started_as_rank()) {
    if (mode == "run") std::printf("PASS: compiled per-rank programs run and bad packages are refused\n");
    if (mode == "saved") std::printf("PASS: compiled saved programs equal the interpreter: %zu programs\n", names.size());
  }
  return rc;
}
