// The cache of freed fully_shard buffers (src/module/fsdp_buffers.h): a freed block serves the next
// request of its size with the bytes it is given, but not a request under half its size nor one made
// under another CPU allocator; a request that runs out of memory lets the kept blocks go first; and they
// go when the last user (a fully_shard group) does.

#include <ATen/ATen.h>

#include <gmock/gmock.h>

#include "../../src/module/fsdp_buffers.h"
#include "../dist/live_bytes_limit.h"

namespace dtensor::testing {
namespace {

using detail::fsdp_buffer;
using detail::FsdpBufferUse;

constexpr int64_t kMiB = 1 << 20;

TEST(FsdpBuffersTest, AFreedBlockServesTheNextRequestOfItsSize) {
  const FsdpBufferUse use;
  const void* freed = nullptr;
  {
    const at::Tensor a = fsdp_buffer(kMiB / 4, at::kFloat);
    freed = a.const_data_ptr();
  }
  const at::Tensor b = fsdp_buffer(kMiB / 4, at::kFloat);
  EXPECT_EQ(b.const_data_ptr(), freed);
  // b holds it now: the next request gets another block, and each keeps what is written to it.
  const at::Tensor c = fsdp_buffer(kMiB / 4, at::kFloat);
  EXPECT_NE(c.const_data_ptr(), freed);
  b.fill_(1);
  c.fill_(2);
  EXPECT_TRUE(at::equal(b, at::ones({kMiB / 4})));
  EXPECT_TRUE(at::equal(c, at::full({kMiB / 4}, 2.0)));
}

TEST(FsdpBuffersTest, ABlockServesNoRequestUnderHalfItsSize) {
  const FsdpBufferUse use;
  const void* freed = nullptr;
  {
    const at::Tensor big = fsdp_buffer(kMiB, at::kFloat);
    freed = big.const_data_ptr();
  }
  EXPECT_NE(fsdp_buffer(kMiB / 4, at::kFloat).const_data_ptr(), freed);
  EXPECT_EQ(fsdp_buffer(kMiB / 2, at::kFloat).const_data_ptr(), freed);
}

// Under a LiveBytesLimit: a first request lets go the blocks kept from allocators before it (whose
// release the limit's counters see as well), so that what follows counts from there.
int64_t live_after_settling(const LiveBytesLimit& budget) {
  { const at::Tensor settle = fsdp_buffer(1, at::kFloat); }
  return budget.live();
}

TEST(FsdpBuffersTest, BlocksAreTakenFromTheCurrentAllocator) {
  const FsdpBufferUse use;
  { const at::Tensor before = fsdp_buffer(kMiB / 4, at::kFloat); }  // kept, from the default allocator
  LiveBytesLimit budget(std::numeric_limits<int64_t>::max());
  const int64_t start = live_after_settling(budget);
  const at::Tensor counted = fsdp_buffer(kMiB / 4, at::kFloat);
  EXPECT_EQ(budget.live() - start, kMiB);  // a new block, which the wrapping allocator counts
}

TEST(FsdpBuffersTest, RunningOutOfMemoryLetsTheKeptBlocksGo) {
  const FsdpBufferUse use;
  LiveBytesLimit budget(40 * kMiB);
  const int64_t start = live_after_settling(budget);
  { const at::Tensor a = fsdp_buffer(4 * kMiB, at::kFloat); }
  EXPECT_EQ(budget.live() - start, 16 * kMiB);  // kept after it was freed
  // 32 MiB more would hold 48: it fits once the kept 16 MiB (too small to serve it) are let go.
  at::Tensor b;
  EXPECT_NO_THROW(b = fsdp_buffer(8 * kMiB, at::kFloat));
  EXPECT_LE(budget.live() - start, 32 * kMiB);
}

TEST(FsdpBuffersTest, KeptBlocksGoWithTheLastUser) {
  LiveBytesLimit budget(std::numeric_limits<int64_t>::max());
  const int64_t start = live_after_settling(budget);
  {
    const FsdpBufferUse group, another;
    { const at::Tensor a = fsdp_buffer(kMiB, at::kFloat); }
    EXPECT_EQ(budget.live() - start, 4 * kMiB);
  }
  EXPECT_EQ(budget.live() - start, 0);
  // With no user, a freed block is not kept.
  { const at::Tensor b = fsdp_buffer(kMiB, at::kFloat); }
  EXPECT_EQ(budget.live() - start, 0);
}

}  // namespace
}  // namespace dtensor::testing
