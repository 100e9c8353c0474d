#pragma once
// What a ContextParallel scope (dtensor/context_parallel.h) tells the parallel styles: the whole
// sequence length of the buffers it sharded over its mesh, while it is alive on this thread. A plain
// module input read as Shard(d) over that mesh whose dim d holds this rank's block of that length is
// that sequence, so its global size is known without a collective, uneven torch.chunk blocks included.

#include <cstdint>
#include <optional>

#include "dtensor/device_mesh.h"

namespace dtensor::detail {

// The length of the innermost scope on this thread over `mesh`, and whether it is load balanced.
struct ContextSequence {
  int64_t length;
  bool load_balanced;
};
std::optional<ContextSequence> context_sequence(const DeviceMesh& mesh);

// The global size of a dim that holds `local` positions of a sequence sharded over the 1-d `mesh` by
// an active scope, when that is this rank's block of it; nullopt otherwise (no scope, another dim).
std::optional<int64_t> context_sequence_size(const DeviceMesh& mesh, int64_t local);

}  // namespace dtensor::detail
