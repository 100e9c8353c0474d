// Propagation works out an op's global output shape on Meta tensors, which hold no memory. A factory
// op's own device argument must not undo that: AccumulateGrad's new_empty_strided(sizes, strides,
// options) on a DTensor parameter names the CPU, and propagating it once allocated the whole global
// tensor on every rank (a cache miss, so at the first backward, when memory is tightest). new_* ops of
// the input's own shape keep its sharding (as PyTorch's do) rather than make it whole on every rank.

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "dtensor/api.h"
#include "dtensor/sharding.h"
#include "harness.h"
#include "peak_live_bytes.h"

namespace dtensor::testing {
namespace {

class PropagationMemoryTest : public DistTest {};

TEST_F(PropagationMemoryTest, FactoryOpsWithADeviceAllocateOnlyTheLocalShard) {
  const MeshPtr m = mesh({4});
  const at::Tensor x = distribute_tensor(at::randn({4096, 257}), m, Placements{Shard(1)});  // uneven: 65 or 64 columns
  const int64_t local_bytes = local_tensor_of(x).numel() * static_cast<int64_t>(sizeof(float));
  for (const auto& make : std::vector<std::function<at::Tensor()>>{
           [&] { return x.new_empty_strided(x.sizes(), x.strides(), x.options()); },
           [&] { return at::empty_like(x, x.options()); }, [&] { return x.new_zeros(x.sizes(), x.options()); },
           [&] { return x.new_full(x.sizes(), 2.0, x.options()); }}) {
    clear_propagation_cache();  // a miss, as the first call of a run is
    PeakLiveBytes bytes;
    const at::Tensor made = make();
    EXPECT_EQ(placements_of(made), placements_of(x));
    EXPECT_EQ(local_tensor_of(made).sizes(), local_tensor_of(x).sizes());
    EXPECT_LE(bytes.peak(), local_bytes + 4096) << "a global " << x.sizes() << " tensor is " << x.numel() * sizeof(float) << " bytes";
  }
}

}  // namespace
}  // namespace dtensor::testing
