#pragma once
// Collectives of a group whose members share one host, through a shared-memory segment: each member
// copies a chunk of its input into its own slot, says so, and reads every member's slot.
// - All-gathers: every slot is copied into the output. Open MPI's all-gather moves each block by a
//   single copy (the kernel's cross-memory attach), yet was slower here at every size on 2 ranks and
//   at all but 256 MiB on 4 (bench/results/collectives.md): the kernel pins pages per call and the
//   rendezvous costs round trips, where this costs two memcpys from cache-warm slots and one flag
//   per chunk.
// - All-to-alls: each member's slot is cut into a share per receiver; a strided block (a redistribute's
//   column blocks) is copied into it directly, so that a redistribution costs the two copies an
//   all-to-all of contiguous blocks does (MPI's would need a packing copy first).
// - Small all-reduces: the slots are reduced into the output, in member order on every member (so
//   every member gets the same bits). The GPT TP step's 128 KiB all-reduces made it 5-10% faster at
//   TP=2 and TP=4 than with MPI_Iallreduce.
// Copies here still run at a third of their speed now and then, for a whole run of one size (seen in
// the collectives benchmark at 1, 16 or 64 MiB). A C program doing the same through MPI's shared
// windows has the same phases, which come and go for every buffer alignment tried, and copies in one
// process never do. A guess, unconfirmed: this machine is a 2-vCPU VM, and when the host runs the two
// vCPUs far apart, reading a slot the other core has just written is slow.

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace dtensor::detail::mpi {

class SharedMemory {
 public:
  // Collective over `comm` (every member calls it, with MPI's call lock held): maps a segment every
  // member shares, or returns null on every member when they do not share a host or the segment
  // cannot be made (the group then uses MPI's all-gather).
  static std::unique_ptr<SharedMemory> create(MPI_Comm comm, int rank, int size);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // Every member calls these in the same order with the same `bytes`. They block until done and throw
  // after `timeout` without news from some member (naming `operation`), leaving the segment unusable.

  // Every member's `bytes` from `input`, in member order, into `output` (`input` may be this member's
  // block of it).
  void all_gather(const void* input, void* output, int64_t bytes, std::chrono::milliseconds timeout);

  // reduce(blocks, output, length): every member's block, in member order, reduced into `output`.
  using Reduce = std::function<void(const std::vector<const void*>& blocks, void* output, int64_t length)>;
  // The reduction of every member's `bytes` from `input` into `output` (which may be `input`); chunks
  // hold whole elements for any element size up to 64 bytes.
  void all_reduce(const void* input, void* output, int64_t bytes, const Reduce& reduce,
                  std::chrono::milliseconds timeout);

  // A block one member sends another in an all-to-all: its bytes, and the granule its pieces are cut
  // in (the bytes of one slice along dim 0, so that a piece of a strided block is a range of slices
  // the sender copies straight into its slot, with no packing first). A pair's block is described
  // alike by its sender and its receiver.
  struct Block {
    int64_t bytes;
    int64_t unit;
  };
  // pack(m, offset, length, slot): bytes [offset, offset + length) of this member's block for member m
  // into `slot`; unpack(m, offset, length, slot): those bytes of member m's block for this one, from
  // `slot`.
  using Pack = std::function<void(int member, int64_t offset, int64_t length, void* slot)>;
  using Unpack = std::function<void(int member, int64_t offset, int64_t length, const void* slot)>;
  // sends[m] goes to member m, receives[m] comes from it, in pieces of whole units; the block a member
  // keeps (its own index) is left to the caller. Returns false, on every member and having moved
  // nothing, when some member's unit exceeds a slot's share per member: run MPI's all-to-all instead.
  bool all_to_all(const std::vector<Block>& sends, const std::vector<Block>& receives, const Pack& pack,
                  const Unpack& unpack, std::chrono::milliseconds timeout);

 private:
  SharedMemory(void* segment, size_t segment_bytes, int rank, int size);

  // How many chunks member `m` has published in its slot so far (one cache line each, so that members
  // do not contend for the line they write).
  std::atomic<uint64_t>& published(int m) const;
  // Member m's slot for chunks of parity `p`: two slots, so that a member writes the next chunk while
  // the others may still read the last one (a member starts chunk c + 2 only after everyone
  // published chunk c + 1, which each did after reading chunk c).
  char* slot(int m, uint64_t p) const;
  // Publishes the chunk just written to this member's slot and waits until every member published theirs.
  void publish_and_wait(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
                        const char* operation);
  // Waits until every member published `chunks`.
  void wait_for_all(uint64_t chunks, std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
                    const char* operation) const;
  // The chunks of `input` go through this member's slot; `use(offset, length, slots)` runs once every
  // member published the chunk at `offset` (slots: every member's, in member order).
  void exchange(const char* operation, const void* input, int64_t bytes, std::chrono::milliseconds timeout,
                const std::function<void(int64_t offset, size_t length, const std::vector<const void*>& slots)>& use);

  void* segment_;
  size_t segment_bytes_;
  int rank_;
  int size_;
  uint64_t chunks_ = 0;  // chunks this member published; the same on every member between all-gathers
  std::mutex mutex_;     // one all-gather at a time per process
};

}  // namespace dtensor::detail::mpi
