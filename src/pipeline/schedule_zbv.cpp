// ZBV zero bubble (PyTorch's ScheduleZBVZeroBubble, from the zero-bubble paper's section 6): two stages
// per rank in V placement, rank r holding "chunk 0", stage r, on the way down and "chunk 1", stage
// 2p - 1 - r, on the way back up. Each backward is split into I and W; the phases below are PyTorch's,
// and with equal F, I and W times they leave no bubble after the warmup.

#include <algorithm>

#include "dtensor/pipeline_schedule.h"
#include "schedule_builder.h"

namespace dtensor::pipeline {
namespace {

// One rank's actions on its two chunks, each kind numbered per chunk in the order run.
class ZbvRank {
 public:
  ZbvRank(int num_ranks, int rank) : stages_{rank, 2 * num_ranks - 1 - rank}, slots_(static_cast<size_t>(rank)) {}

  void forward(int chunk) { run(chunk, ActionKind::Forward, forwards_); }
  void input(int chunk) { run(chunk, ActionKind::BackwardInput, inputs_); }
  void weight(int chunk) { run(chunk, ActionKind::BackwardWeight, weights_); }
  // F, I and W of one chunk back to back.
  void forward_input_weight(int chunk) {
    forward(chunk);
    input(chunk);
    weight(chunk);
  }
  int forwards(int chunk) const { return forwards_[chunk]; }
  int inputs(int chunk) const { return inputs_[chunk]; }
  int weights(int chunk) const { return weights_[chunk]; }

  // Short of microbatches, PyTorch runs the phases as if there were 2p - 1 and blanks the ones past
  // the last: those slots become bubbles.
  std::vector<Slot> slots(int num_microbatches) && {
    for (Slot& slot : slots_)
      if (slot && slot->microbatch >= num_microbatches) slot.reset();
    return std::move(slots_);
  }

 private:
  void run(int chunk, ActionKind kind, int (&counts)[2]) {
    slots_.emplace_back(Action{stages_[chunk], kind, counts[chunk]++});
  }

  int stages_[2];
  int forwards_[2] = {0, 0};
  int inputs_[2] = {0, 0};
  int weights_[2] = {0, 0};
  std::vector<Slot> slots_;
};

std::vector<Slot> zbv_rank(int num_ranks, int rank, int num_microbatches) {
  const int padded_microbatches = std::max(2 * num_ranks - 1, num_microbatches);
  ZbvRank ops(num_ranks, rank);
  // Warmup: fill the way down, then alternate the chunks, then start chunk 1's backwards.
  for (int i = 0; i < 2 * (num_ranks - rank) - 1; ++i) ops.forward(0);
  for (int i = 0; i < rank; ++i) {
    ops.forward(1);
    ops.forward(0);
  }
  for (int i = 0; i < num_ranks - rank; ++i) ops.forward_input_weight(1);
  // Steady: a forward, I and W on each chunk in turn, until chunk 0 has run every forward and chunk 1
  // has caught up with it.
  while (ops.forwards(1) < ops.forwards(0) || ops.forwards(0) < padded_microbatches) {
    if (ops.forwards(0) < padded_microbatches) ops.forward(0);
    ops.input(0);
    ops.weight(0);
    ops.forward_input_weight(1);
  }
  // Cooldown: the remaining input gradients first (the ranks above wait for them), weights after.
  for (int i = 0; i < rank; ++i) {
    ops.input(0);
    ops.input(1);
  }
  for (int i = 0; i < num_ranks - rank; ++i) {
    ops.input(0);
    ops.weight(0);
  }
  while (ops.weights(1) < ops.inputs(1)) ops.weight(1);
  while (ops.weights(0) < ops.inputs(0)) ops.weight(0);
  return std::move(ops).slots(num_microbatches);
}

}  // namespace

Schedule zbv_zero_bubble(int num_ranks, int num_microbatches) {
  Schedule schedule = detail::empty_schedule("ZBVZeroBubble", num_ranks, v_placement(num_ranks, 2 * num_ranks),
                                             num_microbatches);
  for (int rank = 0; rank < num_ranks; ++rank)
    schedule.ranks[static_cast<size_t>(rank)] = zbv_rank(num_ranks, rank, num_microbatches);
  return schedule;
}

}  // namespace dtensor::pipeline
