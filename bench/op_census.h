#pragma once
// Which ops a training step runs, and how long each takes, for comparing two implementations of the
// same step (DTENSOR_OP_CENSUS=1 in the TP-step benchmark). Every op LibTorch records (RecordFunction:
// dispatched ops and autograd nodes) is counted by name, split into ops called on DTensors ("D", the
// sharded op as a whole) and on plain tensors ("L": shards, and everything of the hand-written model),
// with its inclusive time. Found the row-sharded embedding's and the fused cross-entropy's extra
// small ops (2026-11-24); the per-op times include the census's own cost, so compare counts first.

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/dtensor_impl.h"

namespace bench {

class OpCensus {
 public:
  OpCensus() {
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
              // The inputs are read here: by the end callback the call may have consumed them.
              bool on_dtensor = false;
              for (const auto& v : fn.inputs()) on_dtensor = on_dtensor || (v.isTensor() && dtensor::is_dtensor(v.toTensor()));
              auto context = std::make_unique<Started>();
              context->at = Clock::now();
              context->on_dtensor = on_dtensor;
              return context;
            },
            [](const at::RecordFunction& fn, at::ObserverContext* context) {
              const auto* started = static_cast<Started*>(context);
              const bool backward = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
              const std::lock_guard<std::mutex> lock(mutex());
              Entry& e = table()[std::string(started->on_dtensor ? "D " : "L ") + fn.name() + (backward ? " [backward]" : "")];
              ++e.calls;
              e.seconds += std::chrono::duration<double>(Clock::now() - started->at).count();
            })
            .needsInputs(true)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  }
  ~OpCensus() { at::removeCallback(handle_); }
  OpCensus(const OpCensus&) = delete;
  OpCensus& operator=(const OpCensus&) = delete;

  // Prints what was recorded since the last print, per step, slowest first, and starts over.
  static void print(const std::string& who, int steps) {
    const std::lock_guard<std::mutex> lock(mutex());
    std::vector<std::pair<std::string, Entry>> rows(table().begin(), table().end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    std::printf("## Op census: %s (per step, over %d steps)\n\n| op | calls | inclusive us |\n|---|--:|--:|\n", who.c_str(), steps);
    for (const auto& [name, e] : rows)
      std::printf("| %s | %.1f | %.1f |\n", name.c_str(), static_cast<double>(e.calls) / steps, e.seconds * 1e6 / steps);
    std::printf("\n");
    table().clear();
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Started : at::ObserverContext {
    Clock::time_point at;
    bool on_dtensor = false;
  };
  struct Entry {
    long calls = 0;
    double seconds = 0;
  };
  static std::map<std::string, Entry>& table() {
    static std::map<std::string, Entry> t;
    return t;
  }
  static std::mutex& mutex() {  // callbacks may come from other threads (autograd's device threads)
    static std::mutex m;
    return m;
  }
  at::CallbackHandle handle_;
};

}  // namespace bench
