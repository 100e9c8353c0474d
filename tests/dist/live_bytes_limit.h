#pragma once
// A per-process memory limit on LibTorch's CPU tensors, for tests that train under a budget: while a
// LiveBytesLimit is alive, every CPU tensor allocation goes through it, the bytes its allocations hold
// are counted (until freed, whenever that is), and an allocation that would take them over the limit
// fails with LibTorch's out-of-memory error. It also records their peak. Tensors allocated before it
// do not count.

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace dtensor::testing {

class LiveBytesLimit final : public c10::Allocator {
 public:
  explicit LiveBytesLimit(int64_t limit) : inner_(c10::GetCPUAllocator()), limit_(limit), baseline_(counters().live) {
    counters().peak = baseline_;
    c10::SetCPUAllocator(this);
  }
  ~LiveBytesLimit() override { c10::SetCPUAllocator(inner_); }
  LiveBytesLimit(const LiveBytesLimit&) = delete;
  LiveBytesLimit& operator=(const LiveBytesLimit&) = delete;

  // Bytes held by allocations made since construction: now, and at most.
  int64_t peak() const { return counters().peak - baseline_; }
  int64_t live() const { return counters().live - baseline_; }

  c10::DataPtr allocate(size_t bytes) override {
    const auto n = static_cast<int64_t>(bytes);
    const int64_t live = counters().live.fetch_add(n) + n;
    if (live - baseline_ > limit_) {
      counters().live -= n;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "LiveBytesLimit: allocating ", n, " bytes would hold ",
                       live - baseline_, " bytes, over the test's limit of ", limit_);
    }
    int64_t peak = counters().peak;
    while (live > peak && !counters().peak.compare_exchange_weak(peak, live)) {
    }
    // Some kernels allocate raw (data and context one pointer, freed through raw_deleter), so the
    // inner allocation is taken over whole and its size kept beside it.
    c10::DataPtr inner = inner_->allocate(bytes);
    TORCH_INTERNAL_ASSERT(inner.get() == inner.get_context(), "LiveBytesLimit wraps a raw allocator only");
    void* data = inner.release_context();
    {
      std::lock_guard<std::mutex> lock(counters().mutex);
      counters().held[data] = {n, inner_->raw_deleter()};
    }
    return {data, data, &release, inner.device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { inner_->copy_data(dest, src, count); }

 private:
  // Process-wide, so that a tensor freed after the limit is gone still finds its size and deleter.
  struct Counters {
    std::atomic<int64_t> live{0}, peak{0};
    std::mutex mutex;
    struct Held {
      int64_t bytes;
      c10::DeleterFnPtr deleter;  // the inner allocator's
    };
    std::unordered_map<void*, Held> held;
  };
  static Counters& counters() {
    static Counters* counters = new Counters;  // never destroyed: tensors may outlive the test
    return *counters;
  }
  static void release(void* data) {
    Counters& c = counters();
    c10::DeleterFnPtr deleter = nullptr;
    {
      std::lock_guard<std::mutex> lock(c.mutex);
      auto it = c.held.find(data);
      TORCH_INTERNAL_ASSERT(it != c.held.end(), "LiveBytesLimit: freeing a pointer it did not allocate");
      c.live -= it->second.bytes;
      deleter = it->second.deleter;
      c.held.erase(it);
    }
    deleter(data);
  }

  c10::Allocator* inner_;
  int64_t limit_, baseline_;
};

}  // namespace dtensor::testing
