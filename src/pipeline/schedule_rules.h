#pragma once
// The dependencies between actions, shared by the lowering and the checks (private to src/pipeline).

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "dtensor/pipeline_schedule.h"

namespace dtensor::pipeline::detail {

// The actions a rank has run so far.
class ActionSet {
 public:
  void insert(const Action& action) { actions_.insert(key(action)); }
  bool contains(const Action& action) const { return actions_.contains(key(action)); }

 private:
  static std::tuple<int, ActionKind, int> key(const Action& a) { return {a.stage, a.kind, a.microbatch}; }
  std::set<std::tuple<int, ActionKind, int>> actions_;
};

// The neighbouring stage a compute action needs data from: the previous stage for a forward, the
// next one for a backward (B or I). None for the first stage's forward, the last stage's backward
// (it starts from the loss), and W (it needs only its own I).
std::optional<int> producer_stage(const Action& action, int num_stages);

// The compute action on `producer` whose result `action` consumes: a forward of the previous stage;
// for a backward, the next stage's I or B (either one: `backward_kind`).
Action produced_by(const Action& action, int producer, ActionKind backward_kind);

// Whether `action`'s producer ran on this rank before it. For a producer on another rank, whether the
// RECV that brings its result ran here before it.
bool input_arrived(const Schedule& schedule, const Action& action, const ActionSet& done_here);

// The RECV a SEND pairs with, and the SEND a RECV pairs with.
Action matching_recv(const Action& send);
Action matching_send(const Action& recv);

// A rank's list as the cells of PyTorch's tables (_format_pipeline_order, _dump_csv): one per slot, ""
// for a bubble, an overlapped pair in one cell "(0F1;3B0)OVERLAP_F_B" (kOverlappedSuffix closes it).
constexpr std::string_view kOverlappedSuffix = ")OVERLAP_F_B";
std::vector<std::string> cells_of(const Schedule& schedule, size_t rank);

// "rank 1, step 4 (1F2)", for errors.
std::string where(int rank, size_t step, const Action& action);

}  // namespace dtensor::pipeline::detail
