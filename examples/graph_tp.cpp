// Graph-level tensor parallelism: the GPT exported from Python (torch.export, training IR) becomes a
// per-rank program for TP=4, runs on 4 local ranks with its collectives in the graph, and matches the
// whole program run in one process.
//
//   graph_tp [--model PATH] [--tokens N]   (default PATH: the build's graph_models/gpt_train_ir_static.pt2)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <iostream>
#include <sstream>
#include <string>

#include "build_paths.h"
#include "dtensor/dtensor.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/tensor_parallel.h"
#include "gpt/graph_plan.h"

namespace {

namespace g = dtensor::graph;

// The lines of one transformer block (module paths under blocks.0), with the collectives they run.
std::string first_block(const g::Program& program) {
  std::istringstream lines(program.str());
  std::string line, out;
  while (std::getline(lines, line))
    if (line.find("# blocks.0") != std::string::npos) out += "  " + line + "\n";
  return out;
}

int count_of(const g::Graph& graph, const std::string& op) {
  int n = 0;
  for (const g::Node* node : graph.nodes()) n += node->op_name() == op;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = std::string(dtensor::build_paths::graph_models) + "/gpt_train_ir_static.pt2";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--model") model = argv[i + 1];
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 4}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);
    const bool print = world->rank() == 0;
    auto mesh = dtensor::DeviceMesh::create(world, {world->size()}, {.dim_names = {"tp"}});
    const dtensor::ParallelizePlan plan = gpt::graph_plan();
    g::Program whole = g::load_program(model);
    g::Program local = g::tensor_parallel_transform(g::load_program(model), mesh, plan);
    if (print) {
      std::cout << "graph TP: " << model << " on " << world->size() << " ranks\n\n"
                << "block 0 of rank 0's program (placements after the shapes; notes say why a collective is there):\n"
                << first_block(local) << "\ncollectives per forward: "
                << count_of(local.graph, "_c10d_functional::all_reduce") << " all-reduce, "
                << count_of(local.graph, "_c10d_functional::all_gather_into_tensor") << " all-gather, "
                << count_of(local.graph, "_c10d_functional::reduce_scatter_tensor") << " reduce-scatter\n";
    }
    const at::Tensor tokens = at::arange(8 * 32, at::kLong).mul(7).remainder(42).view({8, 32});
    const at::Tensor expected = g::run(whole, {tokens})[0].toTensor();
    const at::Tensor logits = g::run(local, {tokens})[0].toTensor();
    const double diff = (logits - expected).abs().max().item<double>();
    const bool ok = at::allclose(logits, expected, 1e-4, 1e-5);
    if (print) std::cout << "largest difference to the single-process program: " << diff << "\n";
    const int64_t failures = world->sum_across_ranks(ok ? 0 : 1);
    if (print) std::cout << (failures == 0 ? "PASS: every rank's logits equal the single-process program's\n" : "FAIL\n");
    return failures == 0 ? 0 : 1;
  });
}
