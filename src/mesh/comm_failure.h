#pragma once
// How a failed collective or point-to-point transfer on one mesh dim is reported: a DTensorError naming
// this rank, the operation, the mesh dim, how long it ran and why it failed as far as this rank can tell
// (the peers not answering, with their hosts; else the time limit; else a peer that left).

#include <chrono>
#include <exception>
#include <optional>
#include <string>

#include "dtensor/device_mesh.h"
#include "dtensor/errors.h"

namespace dtensor::detail {

// "rank 1: all_gather on dim 0 ('tp') of DeviceMesh(...)"; `operation` may carry more ("recv from
// coordinate 0 (rank 0) [stage 0 -> 1]").
std::string where(const DeviceMesh& mesh, int64_t dim, const std::string& operation);

// The error for `e`, thrown by the operation started at `start`; `peer`: a point-to-point transfer's
// other member (its coordinate along `dim`), the only one it waited for.
DTensorError failure(const DeviceMesh& mesh, int64_t dim, const std::string& operation, std::chrono::steady_clock::time_point start,
                     const std::exception& e, std::optional<int64_t> peer = std::nullopt);

}  // namespace dtensor::detail
