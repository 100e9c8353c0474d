#include "comm_failure.h"

#include <cstdio>

#include "dtensor/world.h"
#include "error_text.h"

namespace dtensor::detail {
namespace {

std::string seconds_since(std::chrono::steady_clock::time_point start) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", s);
  return text;
}

// Why a collective (or a transfer with the member at coordinate `peer`) failed, as far as this rank can
// tell: the peers that are not answering (each with its host, from the world's heartbeats), else the
// time limit, else a peer that left it some other way.
std::string what_happened(const DeviceMesh& mesh, int64_t dim, std::chrono::steady_clock::time_point start,
                          std::optional<int64_t> peer) {
  std::vector<int64_t> members;
  Shape c = *mesh.coordinate();
  for (int64_t i = 0; i < mesh.size(dim); ++i) {
    c[dim] = i;
    if (!peer || *peer == i) members.push_back(mesh.global_rank_at(c));
  }
  const auto limit = mesh.timeout();
  const bool timed_out = std::chrono::steady_clock::now() - start >= limit * 0.9;
  // A peer that died a moment ago (its connections just failed) has not yet missed enough beats.
  const std::string peers = mesh.world()->describe_peers(members, /*settle=*/!timed_out);
  if (!peers.empty()) return "peers not answering: " + peers;
  if (timed_out)
    return "no answer within the time limit of " + std::to_string(limit.count() / 1000.0).substr(0, 6) +
           " s (MeshOptions::timeout or DTENSOR_TIMEOUT_S), though every peer is alive: " +
           (peer ? std::string("the peer must post the matching transfer (a recv for a send, a send for a recv)")
                 : std::string("every rank must run the same collectives in the same order"));
  return peer ? "the peer left the transfer (its connection failed; it may have crashed)"
              : "a peer left the collective (its connection failed; it may have crashed, or called different collectives)";
}

}  // namespace

std::string where(const DeviceMesh& mesh, int64_t dim, const std::string& operation) {
  return "rank " + std::to_string(mesh.world()->rank()) + ": " + operation + " on " + mesh.dim_label(dim) + " of " +
         mesh.str();
}

DTensorError failure(const DeviceMesh& mesh, int64_t dim, const std::string& operation,
                     std::chrono::steady_clock::time_point start, const std::exception& e, std::optional<int64_t> peer) {
  return DTensorError(where(mesh, dim, operation) + " failed after " + seconds_since(start) +
                      " s: " + what_happened(mesh, dim, start, peer) + " (" + without_source_locations(e) + ")");
}

}  // namespace dtensor::detail
