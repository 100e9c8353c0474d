// The main job for now: started as a plain program it launches 4 local ranks itself. On a 1-d mesh
// of 4 and a 2x2 mesh it distributes a tensor with uneven shapes, takes it through every pair of
// placements, prints each redistribution plan (rank 0) and checks every result against the original.

#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

// Sources: every placement kind (Partial sources are made by distribute_tensor's partition).
std::vector<Placement> source_choices() {
  return {Shard(0), Shard(1), Replicate(), Partial(ReduceOp::Sum), Partial(ReduceOp::Avg), Partial(ReduceOp::Max),
          Partial(ReduceOp::Min)};
}
// Targets: what redistribute accepts (Partial is a state ops produce, not a target).
std::vector<Placement> target_choices() { return {Shard(0), Shard(1), Replicate()}; }

std::vector<Placements> product(const std::vector<Placement>& choices, int64_t ndim) {
  std::vector<Placements> out = {{}};
  for (int64_t m = 0; m < ndim; ++m) {
    std::vector<Placements> next;
    for (const auto& prefix : out)
      for (const auto& p : choices) {
        Placements ps = prefix;
        ps.push_back(p);
        next.push_back(ps);
      }
    out = std::move(next);
  }
  return out;
}

bool valid(const Placements& ps, int64_t mesh_ndim, int64_t tensor_ndim) {
  try {
    validate_placements(ps, mesh_ndim, tensor_ndim, "demo");
    return true;
  } catch (const DTensorError&) {
    return false;  // Partial mixes whose value depends on reduction order
  }
}

// Returns the number of mismatches on this rank.
int walk_all_pairs(const MeshPtr& mesh, const at::Tensor& original, bool print) {
  int mismatches = 0, checked = 0;
  const std::vector<Placement> sources = mesh->ndim() == 1 ? source_choices()
                                                           : std::vector<Placement>{Shard(0), Shard(1), Replicate(), Partial()};
  if (print) std::cout << "\n== " << mesh->str() << ", tensor of shape " << original.sizes() << " ==\n";
  for (const auto& src : product(sources, mesh->ndim())) {
    if (!valid(src, mesh->ndim(), original.dim())) continue;
    at::Tensor source = distribute_tensor(original, mesh, src);
    for (const auto& dst : product(target_choices(), mesh->ndim())) {
      const RedistributePlan plan = redistribute_plan(source, dst);
      at::Tensor moved = redistribute(source, dst);
      const bool ok = at::equal(full_tensor(moved), original);
      mismatches += ok ? 0 : 1;
      ++checked;
      if (print) std::cout << (ok ? "  ok   " : "  FAIL ") << plan.str() << "\n";
    }
  }
  if (print) std::cout << "  " << checked << " redistributions checked on " << mesh->str() << "\n";
  return mismatches;
}

}  // namespace

int main(int argc, char** argv) {
  return run_local_ranks(argc, argv, LaunchOptions{}, [](const std::shared_ptr<World>& world) {
    const bool print = world->rank() == 0;
    if (print) std::cout << "dtensor redistribution demo: " << world->size() << " ranks (" << world->launcher() << ")\n";
    // Integer values keep sums and averages exact, so "equal to the original" means bit-identical.
    const at::Tensor original = at::arange(7 * 5, at::kFloat).view({7, 5}).remainder(11) - 5;
    int mismatches = walk_all_pairs(DeviceMesh::create(world, {world->size()}, MeshOptions{{"tp"}}), original, print);
    if (world->size() == 4)
      mismatches += walk_all_pairs(DeviceMesh::create(world, {2, 2}, MeshOptions{{"dp", "tp"}}), original, print);
    // Fault injection for the launcher tests: one rank (not rank 0) reports a mismatch.
    if (const char* fail = std::getenv("DTENSOR_DEMO_FAIL_RANK"); fail && std::atoi(fail) == world->rank()) ++mismatches;
    if (mismatches > 0) std::cerr << "rank " << world->rank() << ": " << mismatches << " mismatches\n";
    // Every rank exits with the verdict of all of them, so a launcher sees any rank's failure.
    const int64_t total = world->sum_across_ranks(mismatches);
    if (print) std::cout << (total == 0 ? "\nPASS: every result equals the original tensor\n" : "\nFAIL: mismatches\n");
    return total == 0 ? 0 : 1;
  });
}
