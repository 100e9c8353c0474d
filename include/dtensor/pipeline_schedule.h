#pragma once
// Pipeline schedules as data: for each rank of the `pp` dim, the list of actions it runs (forward,
// backward, and the sends and receives between stages), in the text PyTorch's
// torch.distributed.pipelining prints and reads ("0F1", "1B0", "0I2", "0W2", "2SEND_F3"). The
// builders make PyTorch's schedules; `validate` refuses a schedule that would not train correctly or
// would hang, before anything runs. No torch here: the runtime that executes a schedule lives apart.
//
// Two forms of a schedule:
// - compute-only: forwards and backwards, with empty slots where a rank waits (PyTorch's
//   pipeline_order, whose None is a bubble). What the builders make and what a user writes.
// - with communication: `with_communication` adds a SEND after each compute whose result another rank
//   needs, and the matching RECV on that rank (PyTorch's _add_send_recv). What the runtime executes.

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace dtensor::pipeline {

enum class ActionKind {
  Forward,         // F
  FullBackward,    // B: input and weight gradients at once
  BackwardInput,   // I: the gradients of the stage's inputs, which the previous stage waits for
  BackwardWeight,  // W: the gradients of the stage's parameters, deferred into the bubbles
  SendForward,     // SEND_F: this stage's output to the next stage
  RecvForward,     // RECV_F: this stage's input from the previous stage
  SendBackward,    // SEND_B: the gradient of this stage's input to the previous stage
  RecvBackward,    // RECV_B: the gradient of this stage's output from the next stage
};

struct Action {
  int stage = 0;
  ActionKind kind = ActionKind::Forward;
  int microbatch = 0;

  bool operator==(const Action&) const = default;
};

// PyTorch's spelling of a kind ("F", "SEND_B") and of an action ("0F1", "2SEND_F3").
std::string to_string(ActionKind kind);
std::string to_string(const Action& action);
// The reverse of to_string. Refuses (DTensorError) anything else, naming the text and the format.
Action parse_action(std::string_view text);

bool is_compute(ActionKind kind);
bool is_communication(ActionKind kind);
// B and W: the actions that compute the parameters' gradients.
bool computes_weight_gradients(ActionKind kind);

// One slot of a rank's list: an action, or nothing (a bubble: the rank waits).
using Slot = std::optional<Action>;

struct Schedule {
  int num_ranks = 0;
  int num_stages = 0;
  int num_microbatches = 0;
  std::vector<int> stage_to_rank;         // [stage] -> the rank that holds it
  std::vector<std::vector<Slot>> ranks;   // [rank] -> its actions, in the order it runs them
  // [rank] -> the slots whose action runs overlapped with the next slot's: PyTorch's OVERLAP_F_B, a
  // forward and a backward of two stages of the rank as one action ("(0F1;3B0)OVERLAP_F_B"), which its
  // runtime (and dtensor's) runs one after the other. Empty but for DualPipeV and tables that say so.
  // Code that inserts or removes slots of `ranks` must move these marks with them.
  std::vector<std::set<size_t>> overlapped;

  int rank_of(int stage) const { return stage_to_rank.at(static_cast<size_t>(stage)); }
  bool has_communication() const;
  bool overlaps_next(size_t rank, size_t slot) const { return rank < overlapped.size() && overlapped[rank].count(slot) > 0; }
};

// Where stages live. Loop: stage s on rank s % ranks (rank r holds r, r + ranks, ...). V: the stages
// go down the ranks and back up, so rank r holds r and 2 * ranks - 1 - r (and so on for more stages):
// the last stage sits with the first, and the turn at the bottom needs no communication.
std::vector<int> loop_placement(int num_ranks, int num_stages);
std::vector<int> v_placement(int num_ranks, int num_stages);

// ---- Builders (compute-only; one stage per rank unless stages_per_rank says otherwise) ------------

// Every forward, then every backward. Bubbles as the timing of unit-time actions gives them.
Schedule gpipe(int num_ranks, int num_microbatches);
// Warm up with ranks - 1 - rank forwards, then alternate forward and backward. The bubbles are the
// tight timing of unit-time actions: (ranks - 1) / (microbatches + ranks - 1) of each rank's steps.
Schedule one_f_one_b(int num_ranks, int num_microbatches);
// Several stages per rank (loop placement), depth first: PyTorch's ScheduleInterleaved1F1B, slot for
// slot. Microbatches must be a multiple of max(1, microbatches / ranks), as PyTorch requires.
Schedule interleaved_1f1b(int num_ranks, int stages_per_rank, int num_microbatches);
// Several stages per rank, breadth first: every microbatch through a rank's first stage, then its
// next (PyTorch's ScheduleLoopedBFS).
Schedule looped_bfs(int num_ranks, int stages_per_rank, int num_microbatches);
// Interleaved 1F1B with backward split into I and W, each W deferred behind later work (ZB-H1,
// PyTorch's ScheduleInterleavedZeroBubble).
Schedule interleaved_zero_bubble(int num_ranks, int stages_per_rank, int num_microbatches);
// Zero bubble on two stages per rank in V placement (PyTorch's ScheduleZBVZeroBubble).
Schedule zbv_zero_bubble(int num_ranks, int num_microbatches);
// DeepSeek's DualPipeV (PyTorch's ScheduleDualPipeV): two stages per rank in V placement, the steady
// phase pairing a forward of one stage with a full backward of the other as one overlapped action,
// the last backwards split into I and W. Needs at least as many microbatches as stages (2 x ranks).
Schedule dual_pipe_v(int num_ranks, int num_microbatches);

// ---- Forms ---------------------------------------------------------------------------------------

// The same actions with the bubbles taken out (overlapped pairs stay paired).
Schedule without_bubbles(const Schedule& schedule);
// A compute-only schedule lowered for execution: after each compute whose result lives on another
// rank, its SEND, and on that rank the RECV, placed before the compute that needs it (PyTorch's
// _add_send_recv). Bubbles are dropped. An overlapped pair runs once both its inputs are there, its
// SENDs after both. Refuses (DTensorError) an order whose ranks wait on each other forever, naming the
// stuck ranks and their next actions.
Schedule with_communication(const Schedule& compute_only);

// PyTorch's _format_pipeline_order: a table of steps (rows) by ranks (columns); an overlapped pair is
// one cell.
std::string format_pipeline_order(const Schedule& schedule);

// ---- Checks --------------------------------------------------------------------------------------

// How a simulated SEND completes. Buffered: at once, as an isend (PyTorch's runtime, dtensor's
// batched p2p); only RECV blocks. Rendezvous: a SEND waits for its RECV, as a blocking send would.
enum class SendCompletion { Buffered, Rendezvous };

// Refuses (DTensorError, naming rank, step, stage and microbatch) a schedule that:
// - names a stage or microbatch out of range, or a stage on a rank that does not hold it;
// - runs a forward of (stage, microbatch) other than exactly once, or its backward other than exactly
//   once (B, or I and then W);
// - runs a backward before its forward, a W before its I, a compute before the input it needs has
//   arrived (the previous stage's forward, the next stage's backward input), a SEND before the compute
//   it sends;
// - has a SEND without its RECV on the peer's rank, or a RECV without its SEND;
// - cannot finish: ranks that wait on each other (simulated with blocking RECVs, and SENDs as
//   `sends` says) are named with their next actions.
// A compute-only schedule is lowered with with_communication first and both forms are checked.
void validate(const Schedule& schedule, SendCompletion sends = SendCompletion::Buffered);

// ---- A user's schedule as a table ----------------------------------------------------------------

// A schedule written as PyTorch's _PipelineScheduleRuntime._load_csv reads it: one row per rank, one
// action per cell ("(0F1;3B0)OVERLAP_F_B" an overlapped pair), an empty cell a bubble. Compute-only or
// with communication. The stages' placement
// is read from which row runs them; the number of stages from the highest stage named. Validated
// before it is returned; a bad cell is refused naming its row and column.
Schedule read_schedule_csv(std::string_view text, int num_microbatches);
// The table read_schedule_csv reads, as PyTorch's _PipelineScheduleRuntime._dump_csv writes one.
std::string schedule_csv(const Schedule& schedule);

}  // namespace dtensor::pipeline
