#include "redistribute_log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dtensor/comm_debug.h"
#include "dtensor/world.h"
#include "executor.h"

namespace dtensor::detail {
namespace {

bool requested() {
  const char* v = std::getenv("DTENSOR_LOG_REDISTRIBUTE");
  return v != nullptr && std::string(v) == "1";
}

std::atomic<bool>& enabled() {
  static std::atomic<bool> on{requested()};
  return on;
}

}  // namespace

void log_redistribute(const DTensorSpec& from, const Placements& to) {
  if (!enabled().load(std::memory_order_relaxed)) return;
  const RedistributePlan& plan = cached_plan(from, to);
  if (plan.steps.empty()) return;
  const std::string line = "dtensor redistribute (rank " + std::to_string(from.mesh->world()->rank()) + ", " +
                           CommContext::current() + "): " + c10::toString(from.meta.dtype) + shape_str(from.meta.shape) +
                           " on " + from.mesh->str() + ", " + plan.str() + "; " +
                           format_bytes(static_cast<double>(plan.total_bytes_per_rank())) + "/rank in total\n";
  std::fputs(line.c_str(), stderr);  // one write per line, so ranks' lines do not interleave mid-line
}

void log_composite_fallback(const std::string& op, const DeviceMesh& mesh) {
  if (!enabled().load(std::memory_order_relaxed)) return;
  const std::string line = "dtensor composite fallback (rank " + std::to_string(mesh.world()->rank()) + "): " + op +
                           " has no sharding rule; ATen's composite implementation runs on its DTensors on " + mesh.str() + "\n";
  std::fputs(line.c_str(), stderr);
}

void reload_redistribute_log_setting() { enabled() = requested(); }

}  // namespace dtensor::detail
