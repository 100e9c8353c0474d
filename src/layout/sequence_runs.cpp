#include <string>
#include <vector>

#include "dtensor/errors.h"
#include "dtensor/layout.h"

namespace dtensor {

std::vector<SequenceRun> sequence_runs(int64_t length, int64_t ranks, int64_t rank, bool head_tail, const std::string& where) {
  if (!head_tail) {
    const ChunkExtent block = chunk_extent(length, ranks, rank);
    return {{rank, block.offset, 0, block.size}};
  }
  if (length % (2 * ranks) != 0)
    throw DTensorError(where + ": a load-balanced sequence of " + std::to_string(length) + " positions does not split into 2 x " +
                       std::to_string(ranks) + " equal chunks; pad it to a multiple of " + std::to_string(2 * ranks) +
                       " or shard it without load balancing");
  const int64_t chunk = length / (2 * ranks), tail = 2 * ranks - 1 - rank;
  return {{rank, rank * chunk, 0, chunk}, {tail, tail * chunk, chunk, chunk}};
}

std::vector<int64_t> sequence_order_of_blocks(int64_t length, int64_t ranks, bool head_tail, const std::string& where) {
  std::vector<int64_t> order(static_cast<size_t>(length));
  int64_t block_offset = 0;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    for (const SequenceRun& run : sequence_runs(length, ranks, rank, head_tail, where))
      for (int64_t i = 0; i < run.size; ++i) order[static_cast<size_t>(run.global_offset + i)] = block_offset + run.local_offset + i;
    block_offset += chunk_extent(length, ranks, rank).size;
  }
  return order;
}

}  // namespace dtensor
