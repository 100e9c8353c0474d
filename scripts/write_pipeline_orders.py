"""PyTorch's own pipeline orders, for dtensor's schedule builders to be compared against
(tests/unit/pipeline_schedule_test.cpp, which reads the directory from DTENSOR_PIPELINE_ORDERS_DIR).

  write_pipeline_orders.py OUT
writes OUT/<schedule>_<stages>_<ranks>_<microbatches>.txt: the text of torch.distributed.pipelining's
_format_pipeline_order for the schedule's compute-only pipeline_order, and beside it .lowered.txt: the
same order with its SENDs and RECVs as PyTorch's _add_send_recv adds them, for
  gpipe, 1f1b                                              at (4, 4, 8)
  interleaved_1f1b, looped_bfs, interleaved_zero_bubble    at (4, 4, 8) and (8, 4, 8)
  zbv_zero_bubble, dual_pipe_v                             at (8, 4, 8) (they need two stages per rank)
  interleaved_zero_bubble                                  at (4, 4, 2) too (see below)

The schedules are built without a process group: their constructors read only a stage's index, the
number of stages, the group's size and rank, so plain objects stand in for PipelineStage.

Where PyTorch 2.15's order is not the compute-only order, or is wrong, the text is normalised here,
each case with its reason below, so that the test's comparison is explicit about the difference:
  - ScheduleGPipe and Schedule1F1B pass their order through _add_reduce_grad, which appends the FSDP
    actions REDUCE_GRAD and WAIT_REDUCE_GRAD (not compute; dtensor adds FSDP actions in its own pass)
    and drops the bubbles (the Nones). The golden keeps PyTorch's dense order without those two
    actions; the C++ test compares its order with the bubbles removed for these two schedules.
  - Schedule1F1B numbers the last rank's forwards from 1 (F1..F8 for 8 microbatches): its warmup
    loop leaves forward_mb at 0 when the last rank has no warmup forwards, and the steady phase then
    increments before use. Its runtime (_step_microbatches) runs microbatches 0..7, so the order is
    wrong, not the schedule; the golden renumbers that rank's forwards from 0.
  - ScheduleInterleavedZeroBubble's _add_bubbles_to_actions lets a backward input (I) run in the same
    step as, or before, the next stage's I it needs: it checks a backward against the next stage's
    full backward (B) only. With fewer microbatches than ranks this shows, e.g. at (4, 4, 2) stage 0's
    I0 shares step 5 with stage 1's. dtensor's bubbles wait for the I, so interleaved_zero_bubble_4_4_2
    (written for that reason) holds PyTorch's order without its bubbles, and the test compares
    dtensor's without bubbles too: the same actions in the same order on every rank.
"""
import copy
import os
import sys
import types

import torch.distributed.pipelining.schedules as pytorch_schedules
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

# Actions PyTorch's lowering adds for FSDP's gradient reduction, not part of a compute-only order.
FSDP_REDUCE_ACTIONS = {"REDUCE_GRAD", "WAIT_REDUCE_GRAD"}


def stand_in_stages(rank, num_ranks, num_stages, style):
    """What a schedule's constructor reads of the PipelineStages one rank holds."""
    placement = generate_stage_to_rank_mapping(num_ranks, num_stages, style=style)
    return [
        types.SimpleNamespace(stage_index=stage, num_stages=num_stages, group_size=num_ranks,
                              group_rank=rank, submod=None, stage_index_to_group_rank=None)
        for stage in range(num_stages) if placement[stage] == rank
    ]


def multi_stage_order(schedule_class, num_stages, num_ranks, num_microbatches, style="loop"):
    """A multi-stage schedule computes every rank's order; rank 0's instance is enough."""
    stages = stand_in_stages(0, num_ranks, num_stages, style)
    return schedule_class(stages, num_microbatches).pipeline_order


def single_stage_order(schedule_class, num_ranks, num_microbatches):
    stage = stand_in_stages(0, num_ranks, num_ranks, "loop")[0]
    order = schedule_class(stage, num_microbatches).pipeline_order
    return {rank: [a for a in actions if a.computation_type.value not in FSDP_REDUCE_ACTIONS]
            for rank, actions in without_bubbles(order).items()}


def renumber_last_rank_forwards_from_zero(order):
    """Schedule1F1B's off-by-one on the last rank (see the module docstring)."""
    last = max(order)
    forward = pytorch_schedules._ComputationType.FORWARD
    order[last] = [a._replace(microbatch_index=a.microbatch_index - 1)
                   if a is not None and a.computation_type == forward else a
                   for a in order[last]]
    forward_microbatches = sorted(a.microbatch_index for a in order[last]
                                  if a is not None and a.computation_type == forward)
    assert forward_microbatches == list(range(len(forward_microbatches))), (
        "PyTorch's 1F1B numbering changed; revisit the normalisation", forward_microbatches)
    return order


def with_send_recv(order, num_stages, style):
    """_add_send_recv alone: PyTorch's runtime also adds FSDP's and WAIT_SEND actions, not compared here."""
    placement = generate_stage_to_rank_mapping(len(order), num_stages, style=style)
    return pytorch_schedules._add_send_recv(copy.deepcopy(order), lambda stage: placement[stage], num_stages)


def without_bubbles(order):
    return {rank: [a for a in actions if a is not None] for rank, actions in order.items()}


def all_orders():
    s = pytorch_schedules
    yield "gpipe_4_4_8", single_stage_order(s.ScheduleGPipe, 4, 8)
    yield "1f1b_4_4_8", renumber_last_rank_forwards_from_zero(single_stage_order(s.Schedule1F1B, 4, 8))
    for num_stages in (4, 8):
        suffix = f"{num_stages}_4_8"
        yield f"interleaved_1f1b_{suffix}", multi_stage_order(s.ScheduleInterleaved1F1B, num_stages, 4, 8)
        yield f"looped_bfs_{suffix}", multi_stage_order(s.ScheduleLoopedBFS, num_stages, 4, 8)
        yield (f"interleaved_zero_bubble_{suffix}",
               multi_stage_order(s.ScheduleInterleavedZeroBubble, num_stages, 4, 8))
    yield ("interleaved_zero_bubble_4_4_2",
           without_bubbles(multi_stage_order(s.ScheduleInterleavedZeroBubble, 4, 4, 2)))
    yield "zbv_zero_bubble_8_4_8", multi_stage_order(s.ScheduleZBVZeroBubble, 8, 4, 8, style="v")
    yield "dual_pipe_v_8_4_8", multi_stage_order(s.ScheduleDualPipeV, 8, 4, 8, style="v")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: write_pipeline_orders.py OUT_DIR")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for name, order in all_orders():
        num_stages = int(name.split("_")[-3])
        style = "v" if name.startswith(("zbv", "dual_pipe_v")) else "loop"
        for suffix, text_of in ((".txt", order), (".lowered.txt", with_send_recv(order, num_stages, style))):
            with open(os.path.join(out_dir, name + suffix), "w") as f:
                f.write(pytorch_schedules._format_pipeline_order(text_of))


if __name__ == "__main__":
    main()
