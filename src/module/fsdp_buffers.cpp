#include "fsdp_buffers.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>

namespace dtensor::detail {
namespace {

class BlockCache final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    c10::Allocator* source = c10::GetCPUAllocator();
    if (auto block = take(bytes, source)) return lend(std::move(*block));
    try {
      return lend({source->allocate(bytes), bytes, source});
    } catch (const c10::OutOfMemoryError&) {
      release_all();  // the blocks kept may be what is missing
      return lend({source->allocate(bytes), bytes, source});
    }
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  void add_user() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++users_;
  }
  void remove_user() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--users_ == 0) clear();
  }

 private:
  struct Block {
    c10::DataPtr data;
    size_t bytes;
    c10::Allocator* source;  // the allocator that gave it
  };

  // A kept block of at least `bytes` from `source`, and at most twice that (a larger one would hold
  // memory the caller does not use); blocks from another allocator are let go.
  std::optional<Block> take(size_t bytes, c10::Allocator* source) {
    std::lock_guard<std::mutex> lock(mutex_);
    largest_ = std::max(largest_, bytes);
    std::optional<Block> found;
    for (auto it = kept_.begin(); it != kept_.end();) {
      if (it->source != source) {
        kept_bytes_ -= it->bytes;
        it = kept_.erase(it);
      } else if (!found && it->bytes >= bytes && it->bytes <= 2 * bytes) {
        kept_bytes_ -= it->bytes;
        found = std::move(*it);
        it = kept_.erase(it);
      } else {
        ++it;
      }
    }
    return found;
  }

  // Keeps a freed block, newest first, letting the oldest go beyond twice the largest block asked for
  // (and every block while no group lives).
  void keep(Block block) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (users_ == 0) return;
    kept_bytes_ += block.bytes;
    kept_.push_front(std::move(block));
    while (kept_bytes_ > 2 * largest_) {
      kept_bytes_ -= kept_.back().bytes;
      kept_.pop_back();
    }
  }

  void release_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    clear();
  }
  void clear() {
    kept_.clear();
    kept_bytes_ = 0;
  }

  // The block as a DataPtr whose deleter gives it back to the cache.
  c10::DataPtr lend(Block block) {
    void* data = block.data.get();
    auto* lent = new Lent{this, std::move(block)};
    return {data, lent, &give_back, c10::Device(c10::DeviceType::CPU)};
  }

  struct Lent {
    BlockCache* cache;
    Block block;
  };
  static void give_back(void* context) {
    auto* lent = static_cast<Lent*>(context);
    lent->cache->keep(std::move(lent->block));
    delete lent;
  }

  std::mutex mutex_;
  std::list<Block> kept_;
  size_t kept_bytes_ = 0;
  size_t largest_ = 0;
  int64_t users_ = 0;
};

BlockCache& cpu_block_cache() {
  // Never destroyed: storages may give blocks back during static destruction.
  static auto* cache = new BlockCache();
  return *cache;
}

}  // namespace

FsdpBufferUse::FsdpBufferUse() { cpu_block_cache().add_user(); }
FsdpBufferUse::~FsdpBufferUse() { cpu_block_cache().remove_user(); }

c10::Allocator* fsdp_buffer_allocator(c10::DeviceType device) {
  return device == c10::DeviceType::CPU ? &cpu_block_cache() : c10::GetAllocator(device);
}

at::Tensor fsdp_buffer(int64_t numel, const at::TensorOptions& options) {
  if (options.device().type() != c10::DeviceType::CPU) return at::empty({numel}, options);
  return at::detail::empty_generic({numel}, &cpu_block_cache(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   c10::typeMetaToScalarType(options.dtype()), std::nullopt);
}

}  // namespace dtensor::detail
