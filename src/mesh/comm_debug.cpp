#include "dtensor/comm_debug.h"

#include <cstdio>

namespace dtensor {
namespace {
thread_local CommDebugMode* g_active = nullptr;
thread_local const char* g_context = "redistribute";
}  // namespace

CommDebugMode::CommDebugMode() : previous_(g_active) { g_active = this; }
CommDebugMode::~CommDebugMode() { g_active = previous_; }
CommDebugMode* CommDebugMode::active() { return g_active; }

void CommDebugMode::record_collective(const std::string& kind, int64_t mesh_dim, int64_t bytes) {
  collectives_.push_back(Collective{CommContext::current(), kind, mesh_dim, bytes});
}

std::vector<std::string> CommDebugMode::ops() const {
  std::vector<std::string> out;
  out.reserve(calls_.size());
  for (const auto& c : calls_) out.push_back(c.op);
  return out;
}

int64_t CommDebugMode::count(const std::string& kind) const {
  int64_t n = 0;
  for (const auto& c : collectives_) n += c.kind == kind;
  return n;
}

std::map<std::string, std::map<std::string, int64_t>> CommDebugMode::counts_by_op() const {
  std::map<std::string, std::map<std::string, int64_t>> out;
  for (const auto& c : collectives_) ++out[c.op][c.kind];
  return out;
}

std::string CommDebugMode::summary() const {
  std::map<std::tuple<std::string, std::string, int64_t>, std::pair<int64_t, int64_t>> rows;
  for (const auto& c : collectives_) {
    auto& row = rows[{c.op, c.kind, c.mesh_dim}];
    ++row.first;
    row.second += c.bytes;
  }
  std::string out = "op | collective | mesh dim | count | bytes\n";
  char line[256];
  for (const auto& [key, value] : rows) {
    std::snprintf(line, sizeof line, "%s | %s | %lld | %lld | %lld\n", std::get<0>(key).c_str(), std::get<1>(key).c_str(),
                  static_cast<long long>(std::get<2>(key)), static_cast<long long>(value.first),
                  static_cast<long long>(value.second));
    out += line;
  }
  for (const auto& op : fallbacks_) out += "composite fallback: " + op + "\n";
  return out;
}

CommContext::CommContext(const char* op) : previous_(g_context) { g_context = op; }
CommContext::~CommContext() { g_context = previous_; }
const char* CommContext::current() { return g_context; }

}  // namespace dtensor
