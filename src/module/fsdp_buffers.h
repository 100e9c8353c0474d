#pragma once
// The buffers fully_shard makes and frees at every gather and reduction (the gathered parameters' storage,
// the all-gather's output, the reduce-scatter's input), each as large as a whole group.
//
// On the CPU they come from a small cache of freed blocks instead of straight from the allocator.
// glibc serves blocks this large with fresh mmaps (a block exactly the size of the one just freed is
// still at its mmap threshold), so every gather would fault in and zero every page again: keeping the
// gathered storage allocated took the large GPT's FSDP=2 step from 627 to 581 ms. The cache holds the
// blocks the default allocator gave (so a wrapping allocator still counts them), at most twice the
// largest block asked for, and only while some group lives (a FsdpBufferUse): it lets them go when
// the last group goes, when the allocator changes, and when an allocation runs out of memory. Other
// devices use their own allocator (CUDA's caches already).

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

namespace dtensor::detail {

// Freed blocks are kept while at least one of these lives (each fully_shard group holds one).
class FsdpBufferUse {
 public:
  FsdpBufferUse();
  ~FsdpBufferUse();
  FsdpBufferUse(const FsdpBufferUse&) = delete;
  FsdpBufferUse& operator=(const FsdpBufferUse&) = delete;
};

// The allocator for a group's storage on `device`.
c10::Allocator* fsdp_buffer_allocator(c10::DeviceType device);

// An uninitialized 1-d tensor of `numel` elements from that allocator.
at::Tensor fsdp_buffer(int64_t numel, const at::TensorOptions& options);

}  // namespace dtensor::detail
