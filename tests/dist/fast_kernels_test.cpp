// The unboxed kernels of t and detach (src/sharding/fast_kernels.h) against the general kernel they
// stand in for, called directly on the same DTensor: the same placements, global sizes and strides,
// the same shard (values, sizes, strides, storage), a shard of its own (an in-place view of the result
// leaves the input alone), and the full tensor single-device LibTorch gives. Every placement kind,
// uneven shards, a 1-d mesh of 4, a 2x2 mesh, and a mesh this rank may be outside of. The op-db runs
// both ops (forward and gradients) through the fast kernels as well.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>
#include <string>
#include <vector>

#include "../../src/sharding/dispatch.h"
#include "dtensor/comm_debug.h"
#include "dtensor/sharding.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

struct ViewCase {
  std::string op;
  std::function<at::Tensor(const at::Tensor&)> run;
};

// The general kernel on `self`, as the dispatcher calls a kernel: below autograd.
at::Tensor through_general_kernel(const std::string& op_name, const at::Tensor& self) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(op_name.c_str(), "");
  torch::jit::Stack stack = {self};
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  detail::dispatch_kernel(op, {}, &stack);
  return stack.back().toTensor();
}

int64_t propagation_lookups() {
  const PropagationCacheStats s = propagation_cache_stats();
  return s.hits + s.misses;
}

// `full` under `placements`: along a Partial mesh dim, the rank at coordinate 0 holds the values and
// the others zeros.
at::Tensor placed(const at::Tensor& full, const MeshPtr& m, const Placements& placements) {
  Placements without_partial = placements;
  bool partial = false, holds_values = true;
  for (size_t dim = 0; dim < placements.size(); ++dim)
    if (placements[dim].is_partial()) {
      without_partial[dim] = Replicate();
      partial = true;
      holds_values = holds_values && (!m->contains_this_rank() || (*m->coordinate())[dim] == 0);
    }
  at::Tensor d = distribute_tensor(full, m, without_partial);
  if (!partial) return d;
  const at::Tensor local = holds_values ? to_local(d).clone() : at::zeros_like(to_local(d));
  return from_local(local, m, placements, {.run_check = false, .shape = full.sizes().vec(), .stride = full.strides().vec()});
}

class FastKernelsTest : public DistTest {};

TEST_F(FastKernelsTest, FastViewKernelsGiveWhatTheGeneralKernelGives) {
  const at::Tensor full = test_tensor({5, 6}, at::kDouble, 11);
  const std::vector<ViewCase> cases = {
      {"aten::t", [](const at::Tensor& x) { return x.t(); }},
      {"aten::detach", [](const at::Tensor& x) { return x.detach(); }},
  };
  struct Layouts {
    MeshPtr mesh;
    std::vector<Placements> placements;
  };
  const std::vector<Layouts> layouts = {
      {mesh({4}), {{Shard(0)}, {Shard(1)}, {Replicate()}, {Partial()}, {Placement::strided_shard(1, 2)}}},
      {mesh({2, 2}),
       {{Shard(0), Shard(1)}, {Shard(1), Shard(0)}, {Shard(0), Shard(0)}, {Partial(), Shard(1)}, {Replicate(), Partial()}}},
      {mesh({2}, {1, 2}), {{Shard(1)}, {Partial()}}},  // ranks 0 and 3 are outside: the general kernel
  };
  for (const auto& [m, placement_list] : layouts) {
    for (const Placements& placements : placement_list) {
      const at::Tensor d = placed(full, m, placements);
      for (const ViewCase& c : cases) {
        SCOPED_TRACE(c.op + " on " + to_string(placements) + " over " + m->str());
        const int64_t lookups_before = propagation_lookups();
        const at::Tensor fast = c.run(d);
        // One cache lookup: the fast kernel ran and did not fall back (which would look up again).
        if (m->contains_this_rank()) EXPECT_EQ(propagation_lookups() - lookups_before, 1);
        const at::Tensor general = through_general_kernel(c.op, d);
        EXPECT_EQ(placements_of(fast), placements_of(general));
        EXPECT_EQ(fast.sizes(), general.sizes());
        EXPECT_EQ(fast.strides(), general.strides());
        const at::Tensor fast_shard = local_tensor_of(fast), general_shard = local_tensor_of(general);
        EXPECT_EQ(fast_shard.sizes(), general_shard.sizes());
        EXPECT_EQ(fast_shard.strides(), general_shard.strides());
        EXPECT_TRUE(tensors_equal(fast_shard, general_shard));
        EXPECT_EQ(fast_shard.is_alias_of(local_tensor_of(d)), general_shard.is_alias_of(local_tensor_of(d)));
        EXPECT_NE(fast_shard.unsafeGetTensorImpl(), local_tensor_of(d).unsafeGetTensorImpl());
        if (m->contains_this_rank()) EXPECT_TRUE(tensors_equal(full_tensor(fast), c.run(full)));
      }
    }
  }
}

// CommDebugMode sees ops the fast kernels run, with their inputs' placements.
TEST_F(FastKernelsTest, FastViewKernelsAreCountedByCommDebugMode) {
  auto m = mesh({4});
  const at::Tensor d = distribute_tensor(test_tensor({5, 6}, at::kDouble, 12), m, Placements{Shard(0)});
  CommDebugMode debug;
  const at::Tensor t = d.t();
  const at::Tensor detached = t.detach();
  ASSERT_EQ(debug.ops().size(), 2u);
  EXPECT_EQ(debug.ops()[0], "aten::t");
  EXPECT_EQ(debug.ops()[1], "aten::detach");
  EXPECT_EQ(debug.total_count(), 0);
  EXPECT_EQ(placements_of(detached), (Placements{Shard(1)}));
}

}  // namespace
}  // namespace dtensor::testing
