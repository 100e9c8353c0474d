#pragma once
// Peak live bytes of the CPU allocator on this thread: while a PeakLiveBytes is alive, LibTorch's CPU
// allocator reports every allocation and free made on this thread to it (through the profiler's
// memory-reporting hook, ThreadLocalDebugInfo's PROFILER_STATE), and it keeps the running total of
// what is allocated since it started and that total's peak. Run ops single-threaded
// (at::set_num_threads(1)) so that the kernels' own buffers are allocated on this thread too.

#include <ATen/ThreadLocalState.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <cstdint>
#include <memory>

namespace dtensor::testing {

class PeakLiveBytes {
 public:
  PeakLiveBytes() : counter_(std::make_shared<Counter>()), guard_(c10::DebugInfoKind::PROFILER_STATE, counter_) {}
  // The most bytes live at once since construction (allocated after it and not yet freed).
  int64_t peak() const { return counter_->peak; }

 private:
  struct Counter : c10::MemoryReportingInfoBase {
    int64_t live = 0, peak = 0;
    void reportMemoryUsage(void*, int64_t bytes, size_t, size_t, c10::Device) override {
      live += bytes;
      peak = std::max(peak, live);
    }
    bool memoryProfilingEnabled() const override { return true; }
  };
  std::shared_ptr<Counter> counter_;
  c10::DebugInfoGuard guard_;
};

}  // namespace dtensor::testing
