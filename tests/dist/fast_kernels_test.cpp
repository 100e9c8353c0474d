// The unboxed kernels of t, view, _unsafe_view and detach (src/sharding/fast_kernels.h) against the
// general kernel they stand in for, called directly on the same DTensor: the same placements, global
// sizes and strides, the same shard (values, sizes, strides, and aliasing the input's shard exactly
// when the general kernel's does), and the full tensor single-device LibTorch gives. Every placement
// kind, uneven shards, a 1-d mesh of 4 and a 2x2 mesh. The op-db runs these ops (forward and
// gradients) through the fast kernels as well.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>
#include <string>
#include <vector>

#include "../../src/sharding/dispatch.h"
#include "harness.h"

namespace dtensor::testing {
namespace {

struct ViewCase {
  std::string op;  // qualified name
  std::function<at::Tensor(const at::Tensor&)> run;
  std::vector<c10::IValue> extra_args;  // after self, for the general kernel's stack
};

// The general kernel on `self` with `extra` arguments, as the dispatcher calls a kernel: below autograd.
at::Tensor through_general_kernel(const std::string& qualified, const at::Tensor& self,
                                  const std::vector<c10::IValue>& extra) {
  const auto dot = qualified.find('.');
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(qualified.substr(0, dot).c_str(), "");
  torch::jit::Stack stack = {self};
  stack.insert(stack.end(), extra.begin(), extra.end());
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  detail::dispatch_kernel(op, {}, &stack);
  return stack.back().toTensor();
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
      holds_values = holds_values && (*m->coordinate())[dim] == 0;
    }
  at::Tensor d = distribute_tensor(full, m, without_partial);
  if (!partial) return d;
  const at::Tensor local = holds_values ? to_local(d).clone() : at::zeros_like(to_local(d));
  return from_local(local, m, placements, {.run_check = false, .shape = full.sizes().vec(), .stride = full.strides().vec()});
}

TEST_F(DistTest, FastViewKernelsGiveWhatTheGeneralKernelGives) {
  const at::Tensor full = test_tensor({5, 6}, at::kDouble, 11);
  const std::vector<int64_t> split = {5, 2, 3};
  const std::vector<ViewCase> cases = {
      {"aten::t", [](const at::Tensor& x) { return x.t(); }, {}},
      {"aten::view", [&](const at::Tensor& x) { return x.view(split); }, {c10::IValue(split)}},
      {"aten::_unsafe_view", [&](const at::Tensor& x) { return at::_unsafe_view(x, split); }, {c10::IValue(split)}},
      {"aten::detach", [](const at::Tensor& x) { return x.detach(); }, {}},
  };
  const std::vector<std::pair<Shape, std::vector<Placements>>> layouts = {
      {{4},
       {{Shard(0)}, {Shard(1)}, {Replicate()}, {Partial()}, {Placement::strided_shard(1, 2)}}},
      {{2, 2}, {{Shard(0), Shard(1)}, {Shard(1), Shard(0)}, {Shard(0), Shard(0)}, {Partial(), Shard(1)}, {Replicate(), Partial()}}},
  };
  for (const auto& [shape, placement_list] : layouts) {
    auto m = mesh(shape);
    for (const Placements& placements : placement_list) {
      const at::Tensor d = placed(full, m, placements);
      for (const ViewCase& c : cases) {
        SCOPED_TRACE(c.op + " on " + to_string(placements) + " over a mesh of " + shape_str(shape));
        const at::Tensor fast = c.run(d);
        const at::Tensor general = through_general_kernel(c.op, d, c.extra_args);
        EXPECT_EQ(placements_of(fast), placements_of(general));
        EXPECT_EQ(fast.sizes(), general.sizes());
        EXPECT_EQ(fast.strides(), general.strides());
        const at::Tensor fast_shard = to_local(fast), general_shard = to_local(general);
        EXPECT_EQ(fast_shard.sizes(), general_shard.sizes());
        EXPECT_EQ(fast_shard.strides(), general_shard.strides());
        EXPECT_TRUE(tensors_equal(fast_shard, general_shard));
        EXPECT_EQ(fast_shard.is_alias_of(to_local(d)), general_shard.is_alias_of(to_local(d)));
        EXPECT_TRUE(tensors_equal(full_tensor(fast), c.run(full)));
      }
    }
  }
}

}  // namespace
}  // namespace dtensor::testing
