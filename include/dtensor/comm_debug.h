#pragma once
// CommDebugMode: while alive, records on this thread every DTensor op that is dispatched and every
// collective dtensor runs (kind, mesh dim, bytes), attributed to the op that caused it (or to the
// API call, e.g. "redistribute"). For tests ("a row-sharded mm then Replicate is one all-reduce") and
// for finding out where communication comes from.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtensor/placement.h"

namespace dtensor {

class CommDebugMode {
 public:
  struct Collective {
    std::string op;          // "aten::mm", or the API function ("redistribute", "distribute_tensor", ...)
    std::string kind;        // "all-gather", "all-reduce", "reduce-scatter", "all-to-all", "broadcast", "scatter"
    int64_t mesh_dim;
    int64_t bytes;           // bytes of the buffer this rank handed to the collective
  };

  struct OpCall {
    std::string op;                 // "aten::mm"
    std::vector<Placements> inputs;  // the placements each tensor input arrived with
  };

  CommDebugMode();
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  const std::vector<Collective>& collectives() const { return collectives_; }
  // Every DTensor op dispatched (qualified names, in order), and with its inputs' placements.
  std::vector<std::string> ops() const;
  const std::vector<OpCall>& op_calls() const { return calls_; }
  int64_t count(const std::string& kind) const;
  int64_t total_count() const { return static_cast<int64_t>(collectives_.size()); }
  // {op -> {kind -> count}}
  std::map<std::string, std::map<std::string, int64_t>> counts_by_op() const;
  // A table: op, collective, mesh dim, count, bytes; then the ops that ran by composite fallback.
  std::string summary() const;
  // Ops without a sharding rule that ran ATen's composite implementation on the DTensors (its
  // constituent ops then each dispatched with their rules), in order.
  const std::vector<std::string>& composite_fallbacks() const { return fallbacks_; }

  // Hooks for dtensor's own code.
  static CommDebugMode* active();
  void record_op(std::string op, std::vector<Placements> inputs) { calls_.push_back({std::move(op), std::move(inputs)}); }
  void record_collective(const std::string& kind, int64_t mesh_dim, int64_t bytes);
  void record_composite_fallback(std::string op) { fallbacks_.push_back(std::move(op)); }

 private:
  CommDebugMode* previous_;
  std::vector<Collective> collectives_;
  std::vector<OpCall> calls_;
  std::vector<std::string> fallbacks_;
};

// Names the op that collectives on this thread are attributed to while alive (nestable).
class CommContext {
 public:
  explicit CommContext(const char* op);
  ~CommContext();
  static const char* current();

 private:
  const char* previous_;
};

}  // namespace dtensor

namespace dtensor {

// While alive, sums the time this thread spends blocked in dtensor's communication: a collective from
// its launch to its completion, the posting of transfers and collectives started to overlap, and the
// waits for them. Time a transfer spends in flight while the thread computes is not counted, so the sum
// is the communication a step exposes (what overlap did not hide). Nestable. The same spans show in a
// PyTorch profiler's trace as user scopes named "dtensor::<operation>" ("dtensor::all-gather",
// "dtensor::wait for transfers").
class CommunicationTime {
 public:
  CommunicationTime();
  ~CommunicationTime();
  CommunicationTime(const CommunicationTime&) = delete;
  CommunicationTime& operator=(const CommunicationTime&) = delete;

  double seconds() const { return seconds_; }

  // Hook for dtensor's own code: adds a blocked span to the active counts of this thread.
  static void add(double seconds);

 private:
  CommunicationTime* previous_;
  double seconds_ = 0;
};

}  // namespace dtensor
