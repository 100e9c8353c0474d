#include "mpi_shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "mpi_runtime.h"
#include "mpi_work.h"

namespace dtensor::detail::mpi {
namespace {

// A slot's size: large enough that a flag per chunk costs little next to its copies, small enough to
// stay in cache between the member that writes it and those that read it (measured best at 512 KiB
// among 128 KiB - 4 MiB, on 2 and 4 ranks).
constexpr int64_t kChunkBytes = 512 << 10;
constexpr size_t kFlagBytes = 64;

// The flags, then the slots from a page boundary.
size_t flags_size(int size) { return (static_cast<size_t>(size) * kFlagBytes + 4095) / 4096 * 4096; }
size_t segment_size(int size) { return flags_size(size) + static_cast<size_t>(size) * 2 * kChunkBytes; }

// What member 0 tells the others: whether it made the segment, and its name.
struct Announcement {
  int made = 0;
  char name[60] = {};
};

void* map(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

std::unique_ptr<SharedMemory> SharedMemory::create(MPI_Comm comm, int rank, int size) {
  MPI_Comm host;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  int host_size = 0;
  MPI_Comm_size(host, &host_size);
  MPI_Comm_free(&host);
  int one_host = host_size == size ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &one_host, 1, MPI_INT, MPI_MIN, comm);
  if (!one_host || size < 2) return nullptr;

  const size_t bytes = segment_size(size);
  Announcement announcement;
  int fd = -1;
  if (rank == 0) {
    static uint64_t made_so_far = 0;
    std::snprintf(announcement.name, sizeof announcement.name, "/dtensor-collectives-%d-%llu", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(made_so_far++));
    fd = shm_open(announcement.name, O_CREAT | O_EXCL | O_RDWR, 0600);
    // Allocated now, not on first touch: a full /dev/shm (64 MiB in a default Docker container)
    // then means MPI's collectives instead of a SIGBUS mid-collective.
    announcement.made = fd >= 0 && posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0;
  }
  MPI_Bcast(&announcement, sizeof announcement, MPI_BYTE, 0, comm);
  if (rank != 0 && announcement.made) fd = shm_open(announcement.name, O_RDWR, 0600);
  void* segment = announcement.made && fd >= 0 ? map(fd, bytes) : nullptr;
  if (fd >= 0) close(fd);
  int mapped = segment ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &mapped, 1, MPI_INT, MPI_MIN, comm);
  // Everyone who could open it has: the name can go (the memory lives while mapped).
  if (rank == 0 && fd >= 0) shm_unlink(announcement.name);
  if (!mapped) {
    if (segment) munmap(segment, bytes);
    return nullptr;
  }
  return std::unique_ptr<SharedMemory>(new SharedMemory(segment, bytes, rank, size));
}

SharedMemory::SharedMemory(void* segment, size_t segment_bytes, int rank, int size)
    : segment_(segment), segment_bytes_(segment_bytes), rank_(rank), size_(size) {}

SharedMemory::~SharedMemory() { munmap(segment_, segment_bytes_); }

std::atomic<uint64_t>& SharedMemory::published(int m) const {
  static_assert(sizeof(std::atomic<uint64_t>) <= kFlagBytes && std::atomic<uint64_t>::is_always_lock_free);
  // The segment starts zeroed (a new file's allocated pages), which is the atomic's value 0.
  return *reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(segment_) + static_cast<size_t>(m) * kFlagBytes);
}

char* SharedMemory::slot(int m, uint64_t p) const {
  return static_cast<char*>(segment_) + flags_size(size_) + (static_cast<size_t>(m) * 2 + (p & 1)) * kChunkBytes;
}

void SharedMemory::wait_for_all(uint64_t chunks, std::chrono::steady_clock::time_point deadline,
                                std::chrono::milliseconds timeout, const char* operation) const {
  // Spinning takes the core from the member being waited for when ranks outnumber cores.
  const bool yield = oversubscribed();
  for (int m = 0; m < size_; ++m)
    for (int polls = 1; published(m).load(std::memory_order_acquire) < chunks; ++polls) {
      if (yield || polls > 1000) std::this_thread::yield();
      if ((polls & 63) == 0 && std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(std::string("MPI ") + operation + " did not complete within " + seconds_text(timeout) +
                                 " (member " + std::to_string(m) +
                                 " of the group never joined); the group's communicator is unusable from now on");
    }
}

void SharedMemory::publish_and_wait(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
                                    const char* operation) {
  published(rank_).store(++chunks_, std::memory_order_release);
  wait_for_all(chunks_, deadline, timeout, operation);
}

void SharedMemory::exchange(const char* operation, const void* input, int64_t bytes, std::chrono::milliseconds timeout,
                            const std::function<void(int64_t, size_t, const std::vector<const void*>&)>& use) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const char* in = static_cast<const char*>(input);
  std::vector<const void*> slots(static_cast<size_t>(size_));
  for (int64_t offset = 0; offset < bytes; offset += kChunkBytes) {
    const auto length = static_cast<size_t>(std::min(kChunkBytes, bytes - offset));
    const uint64_t parity = chunks_;
    std::memcpy(slot(rank_, parity), in + offset, length);
    publish_and_wait(deadline, timeout, operation);
    for (int m = 0; m < size_; ++m) slots[static_cast<size_t>(m)] = slot(m, parity);
    use(offset, length, slots);
  }
}

void SharedMemory::all_gather(const void* input, void* output, int64_t bytes, std::chrono::milliseconds timeout) {
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  exchange("all-gather", input, bytes, timeout, [&](int64_t offset, size_t length, const std::vector<const void*>& slots) {
    for (int m = 0; m < size_; ++m) {
      char* to = out + static_cast<size_t>(m) * static_cast<size_t>(bytes) + static_cast<size_t>(offset);
      // This member's block comes from its input, which may be that very block of the output.
      const char* from = m == rank_ ? in + offset : static_cast<const char*>(slots[static_cast<size_t>(m)]);
      if (to != from) std::memcpy(to, from, length);
    }
  });
}

void SharedMemory::all_reduce(const void* input, void* output, int64_t bytes, const Reduce& reduce,
                              std::chrono::milliseconds timeout) {
  char* out = static_cast<char*>(output);
  exchange("all-reduce", input, bytes, timeout, [&](int64_t offset, size_t length, const std::vector<const void*>& slots) {
    reduce(slots, out + offset, static_cast<int64_t>(length));
  });
}

bool SharedMemory::all_to_all(const std::vector<Block>& sends, const std::vector<Block>& receives, const Pack& pack,
                              const Unpack& unpack, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // A slot holds a share for every receiver, each a whole number of cache lines.
  const int64_t share = kChunkBytes / size_ / 64 * 64;
  const auto step = [share](const Block& b) { return b.unit > 0 ? share / b.unit * b.unit : share; };
  // First an exchange of headers: the rounds this member's sends need, or -1 when one of its blocks
  // (sent or received) cannot be cut to fit a share. Then every member runs the most rounds any needs.
  int64_t rounds = 0;
  bool fits = true;
  for (int m = 0; m < size_; ++m)
    for (const Block& b : {sends[static_cast<size_t>(m)], receives[static_cast<size_t>(m)]}) {
      if (m == rank_ || b.bytes == 0) continue;
      fits = fits && b.unit <= share;
      if (fits) rounds = std::max(rounds, (b.bytes + step(b) - 1) / step(b));
    }
  if (!fits) rounds = -1;
  const uint64_t header_parity = chunks_;
  std::memcpy(slot(rank_, header_parity), &rounds, sizeof rounds);
  publish_and_wait(deadline, timeout, "all-to-all");
  int64_t all_rounds = 0;
  for (int m = 0; m < size_; ++m) {
    int64_t theirs;
    std::memcpy(&theirs, slot(m, header_parity), sizeof theirs);
    if (theirs < 0) return false;
    all_rounds = std::max(all_rounds, theirs);
  }
  // The piece of `b` in round r: [offset, offset + length), length 0 once the block is done.
  const auto piece = [&](const Block& b, int64_t r) {
    const int64_t offset = r * step(b);
    return std::pair<int64_t, int64_t>{offset, std::clamp<int64_t>(b.bytes - offset, 0, step(b))};
  };
  for (int64_t r = 0; r < all_rounds; ++r) {
    const uint64_t parity = chunks_;
    for (int m = 0; m < size_; ++m) {
      const auto [offset, length] = piece(sends[static_cast<size_t>(m)], r);
      if (m != rank_ && length > 0) pack(m, offset, length, slot(rank_, parity) + static_cast<size_t>(m) * share);
    }
    publish_and_wait(deadline, timeout, "all-to-all");
    for (int m = 0; m < size_; ++m) {
      const auto [offset, length] = piece(receives[static_cast<size_t>(m)], r);
      if (m != rank_ && length > 0) unpack(m, offset, length, slot(m, parity) + static_cast<size_t>(rank_) * share);
    }
  }
  return true;
}

}  // namespace dtensor::detail::mpi
