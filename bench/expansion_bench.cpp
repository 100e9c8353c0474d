// How long SPMD expansion takes against the depth of the model: a Hugging Face Llama's joint
// forward+backward graph (scripts/export_llama_depths.py), expanded on DP2 x TP2 over 4 local ranks
// with the model's own plan, the batch sharded over dp. Each rank times its own spmd_expand (loading
// excluded); the line reports the slowest rank, the graph's size, the chosen plan's modelled cost and
// its collectives. (That such expansions train like one process is the test suite's business:
// HuggingFaceTraining, on the 2-layer export.)
//
//   dtensor_expansion_bench --model DIR/llama_L<N>_joint.pt2 --plan DIR/llama_tp_plan.json
//                           [--search greedy|local|exact]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

#include "dtensor/dtensor.h"
#include "dtensor/graph/hugging_face.h"
#include "dtensor/graph/program.h"
#include "dtensor/graph/spmd.h"
#include "dtensor/graph/tensor_parallel.h"
#include "dtensor/graph/training.h"
#include "dtensor/world.h"

namespace {

namespace g = dtensor::graph;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, plan_path, search = "auto";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--model") model = argv[i + 1];
    if (std::string(argv[i]) == "--plan") plan_path = argv[i + 1];
    if (std::string(argv[i]) == "--search") search = argv[i + 1];
  }
  if (model.empty() || plan_path.empty()) {
    std::cerr << "usage: dtensor_expansion_bench --model JOINT.pt2 --plan PLAN.json [--search greedy|local|exact]\n";
    return 2;
  }
  const dtensor::ParallelizePlan plan = g::hugging_face_plan(read_text(plan_path), "", plan_path);
  return dtensor::run_local_ranks(argc, argv, {.nprocs = 4}, [&](const std::shared_ptr<dtensor::World>& world) {
    at::set_num_threads(1);
    auto mesh = dtensor::DeviceMesh::create(world, {2, 2}, {.dim_names = {"dp", "tp"}});
    g::Program program = g::load_program(model);
    const size_t nodes = program.graph.size();
    g::SpmdPlacements where;
    where.user_inputs.assign(2, {dtensor::Shard(0), dtensor::Replicate()});
    where.state = g::plan_placements(program, *mesh, plan, {.tp_dim = "tp"});
    g::SpmdOptions options;
    options.search = search == "greedy"  ? g::SpmdOptions::Search::Greedy
                     : search == "local" ? g::SpmdOptions::Search::LocalSearch
                     : search == "exact" ? g::SpmdOptions::Search::Exact
                                         : g::SpmdOptions::Search::Auto;
    const auto start = std::chrono::steady_clock::now();
    g::Program step = g::spmd_expand(std::move(program), mesh, where, options);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The slowest rank's time, in milliseconds, through the store.
    const int64_t ms = static_cast<int64_t>(seconds * 1000);
    int64_t slowest = 0;
    for (int r = 0; r < world->size(); ++r) slowest = std::max(slowest, world->sum_across_ranks(r == world->rank() ? ms : 0));
    if (world->rank() == 0) {
      std::map<std::string, int> counts;
      for (const auto& c : g::collectives(step)) ++counts[c.op];
      std::cout << model << ": " << nodes << " nodes, expanded in " << slowest / 1000.0 << " s (" << step.strategy_costs.method
                << ", modelled " << step.strategy_costs.chosen / 1e3 << " kB vs node by node " << step.strategy_costs.node_by_node / 1e3
                << " kB); collectives:";
      for (const auto& [op, n] : counts) std::cout << " " << n << " " << op.substr(op.find("::") + 2);
      std::cout << "\n";
    }
    return 0;
  });
}
