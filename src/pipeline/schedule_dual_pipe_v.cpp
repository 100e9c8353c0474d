// DualPipeV (PyTorch's ScheduleDualPipeV, after DeepSeek's DualPipe): two stages per rank in V placement,
// rank r holding stage r on the way down and stage 2p - 1 - r on the way back up. Its phases, below,
// are PyTorch's: a rank fills the way down, then runs its main phase as overlapped pairs, a forward of
// one stage with a full backward of the other, and ends on backwards whose second half is split into I
// and W, each W run in the order its I ran, where a slot would otherwise wait.

#include <deque>

#include "dtensor/errors.h"
#include "dtensor/pipeline_schedule.h"
#include "schedule_builder.h"

namespace dtensor::pipeline {
namespace {

// One rank's list as it is built: each stage's forwards and backwards numbered in the order run (a B
// or an I takes the stage's next backward), and the W each I leaves, queued.
class DualPipeVRank {
 public:
  explicit DualPipeVRank(int num_ranks, int rank) : down_(rank), up_(2 * num_ranks - 1 - rank) {}

  int down() const { return down_; }
  int up() const { return up_; }

  void forward(int stage) { slots_.emplace_back(Action{stage, ActionKind::Forward, forwards_[index(stage)]++}); }
  void backward(int stage, bool split) {
    const Action action{stage, split ? ActionKind::BackwardInput : ActionKind::FullBackward, backwards_[index(stage)]++};
    slots_.emplace_back(action);
    if (split) pending_weights_.push_back({stage, ActionKind::BackwardWeight, action.microbatch});
  }
  // A forward of one stage overlapped with a full backward of the other.
  void forward_with_backward(int forward_stage, int backward_stage) {
    overlapped_.insert(slots_.size());
    forward(forward_stage);
    backward(backward_stage, false);
  }
  void oldest_pending_weight() {
    if (pending_weights_.empty()) return;
    slots_.emplace_back(pending_weights_.front());
    pending_weights_.pop_front();
  }

  std::vector<Slot> slots() && { return std::move(slots_); }
  std::set<size_t> overlapped() const { return overlapped_; }

 private:
  size_t index(int stage) const { return stage == down_ ? 0 : 1; }

  int down_, up_;
  int forwards_[2] = {0, 0};
  int backwards_[2] = {0, 0};
  std::deque<Action> pending_weights_;
  std::vector<Slot> slots_;
  std::set<size_t> overlapped_;
};

DualPipeVRank dual_pipe_v_rank(int num_ranks, int rank, int num_microbatches) {
  DualPipeVRank ops(num_ranks, rank);
  const int down = ops.down(), up = ops.up();
  // Fill the way down, then alternate the two stages.
  for (int i = 0; i < 2 * (num_ranks - rank - 1); ++i) ops.forward(down);
  for (int i = 0; i <= rank; ++i) {
    ops.forward(down);
    ops.forward(up);
  }
  // The way back starts: zero-bubble backwards of the upper stage between its forwards.
  for (int i = 0; i < num_ranks - rank - 1; ++i) {
    ops.backward(up, true);
    ops.oldest_pending_weight();
    ops.forward(up);
  }
  // Main phase: pairs. The last rank's first pair is run apart, which shortens its bubble.
  for (int i = 0; i < num_microbatches - 2 * num_ranks + rank + 1; ++i) {
    if (i == 0 && rank == num_ranks - 1) {
      ops.forward(down);
      ops.backward(up, false);
    } else {
      ops.forward_with_backward(down, up);
    }
    ops.forward_with_backward(up, down);
  }
  for (int i = 0; i < num_ranks - rank - 1; ++i) {
    ops.backward(up, false);
    ops.forward_with_backward(up, down);
  }
  // Both stages' last backwards; from the middle on (upper stage first on odd ranks), split in I and W.
  const int last_backwards = rank + 1;
  bool split = false;
  for (int i = 0; i < last_backwards; ++i) {
    if (i == last_backwards / 2 && rank % 2 == 1) split = true;
    ops.backward(up, split);
    if (i == last_backwards / 2 && rank % 2 == 0) split = true;
    ops.backward(down, split);
  }
  for (int i = 0; i < num_ranks - rank - 1; ++i) {
    ops.oldest_pending_weight();
    ops.backward(down, split);
  }
  for (int i = 0; i <= rank; ++i) ops.oldest_pending_weight();
  return ops;
}

}  // namespace

Schedule dual_pipe_v(int num_ranks, int num_microbatches) {
  if (num_ranks >= 1 && num_microbatches < 2 * num_ranks)
    throw DTensorError("pipeline schedule DualPipeV: needs at least as many microbatches as stages (" + std::to_string(2 * num_ranks) +
                       " on " + std::to_string(num_ranks) + " ranks), got " + std::to_string(num_microbatches) + ", as PyTorch requires");
  Schedule schedule = detail::empty_schedule("DualPipeV", num_ranks, v_placement(num_ranks, 2 * num_ranks), num_microbatches);
  schedule.overlapped.resize(static_cast<size_t>(num_ranks));
  for (int rank = 0; rank < num_ranks; ++rank) {
    DualPipeVRank ops = dual_pipe_v_rank(num_ranks, rank, num_microbatches);
    schedule.overlapped[static_cast<size_t>(rank)] = ops.overlapped();
    schedule.ranks[static_cast<size_t>(rank)] = std::move(ops).slots();
  }
  return schedule;
}

}  // namespace dtensor::pipeline
