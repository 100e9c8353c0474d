#pragma once
// What a save writes, before any file: every tensor's pieces (which rank writes which box) and this
// rank's data for them, after the collectives a save needs (Partial shards reduced, whole tensors
// gathered on their writers). Shared by dtensor's own format (save.cpp) and PyTorch DCP's (dcp_save.cpp).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "dtensor/checkpoint.h"
#include "dtensor/pieces.h"
#include "job.h"

namespace dtensor::checkpoint::detail {

// One tensor of the state as it will be saved.
struct Saved {
  std::string name;
  std::string dtype;  // safetensors' name
  at::ScalarType scalar_type;
  Shape global_shape;
  std::vector<Piece> pieces;  // writer: holders[0]
  at::Tensor local;           // this rank's data (a DTensor's shard, reduced if Partial; a plain tensor)
};

// A rank is the first holder of at most one piece of a tensor: its own shard.
inline bool writes(const Piece& p, int rank) { return p.holders.front() == rank; }

// What a save holds once its collectives are done: every piece this rank writes, in memory of its
// own when `staged` (so that the state may change while the files are written).
struct Prepared {
  Job job;
  std::vector<Saved> saved;
  // Whether this rank prepares the directory and writes the index and the commit marker: rank 0, or in
  // a node-local save the first rank of each host, so that every node's directory has its own.
  bool leads_directory = false;
  std::vector<std::string> hosts;  // a node-local save's: every rank's host
};

Prepared prepare(const State& state, const SaveOptions& options, bool staged);

}  // namespace dtensor::checkpoint::detail
