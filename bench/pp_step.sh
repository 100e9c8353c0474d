#!/usr/bin/env bash
# Runs the pipeline-parallel training-step benchmark (bench/pp_step_bench.cpp: dtensor's PipelineRunner
# with GPipe, 1F1B, Interleaved 1F1B, ZBV and DualPipeV, and a hand-written 1F1B over raw c10d) on the MPI backend
# and on Gloo, and PyTorch's own pipelining (bench/pp_pytorch.py) on Gloo, for the deep and the small
# GPT, and writes bench/results/pp_step.md.
#   bench/pp_step.sh <build-dir> [--rounds R]      (what `./dev bench pp` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/pp_step.sh <build-dir> [--rounds R]}
shift
ROUNDS=10
if [[ ${1:-} == --rounds ]]; then ROUNDS=$2; fi
PYTHON=$(sed -n 's/^DTENSOR_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
RESULTS=$ROOT/bench/results/pp_step.md
BENCH=$BUILD/bench/dtensor_pp_step_bench
NOTES=$(mktemp)
trap 'rm -f "$NOTES"' EXIT

# bench_rows BACKEND ARGS...: the table rows on stdout, the other lines (losses, ratios) to $NOTES.
bench_rows() {
  local backend=$1 out
  shift
  out=$(on_backend "$backend" "$BENCH" "$@")
  grep '^|' <<<"$out"
  grep -v '^|' <<<"$out" | grep -v '^$' >>"$NOTES" || true
}

# against_pytorch TABLE: per model and schedule, dtensor's step over PyTorch's (on Gloo, and on MPI, dtensor's
# default, which PyTorch's wheels lack), and the compute floor's (the lower of its two runs) over PyTorch's.
against_pytorch() {
  awk -F' *\\| *' '
    { ms[$2 "|" $3 "|" $4 "|" $5] = $7 }
    END {
      split("deep small", models, " "); split("1F1B|Interleaved 1F1B", schedules, "|")
      for (i = 1; i <= 2; i++) for (j = 1; j <= 2; j++) {
        pt = ms[models[i] "|gloo|PyTorch pipelining|" schedules[j]]; dt = ms[models[i] "|gloo|dtensor PipelineRunner|" schedules[j]]
        dm = ms[models[i] "|mpi|dtensor PipelineRunner|" schedules[j]]
        floor = ms[models[i] "|gloo|compute floor|forwards and backwards alone"]; mpi_floor = ms[models[i] "|mpi|compute floor|forwards and backwards alone"]
        if (mpi_floor != "" && (floor == "" || mpi_floor + 0 < floor + 0)) floor = mpi_floor
        if (pt == "" || dt == "") continue
        printf "- %s, %s: PyTorch %.2f ms; dtensor on Gloo %.2f ms, ratio %.2f", models[i], schedules[j], pt, dt, dt / pt
        if (dm != "") printf "; dtensor on MPI %.2f ms, ratio %.2f", dm, dm / pt
        if (floor != "") printf "; the compute floor %.2f ms, ratio %.2f", floor, floor / pt
        printf "\n"
      }
    }' "$1"
}

{
  cat <<HEADER
# GPT training step, pipeline parallel: dtensor vs hand-written 1F1B vs PyTorch's pipelining (CPU)

Command: \`./dev bench pp${*:+ $*}\` (runs \`bench/pp_step.sh\`: \`dtensor_pp_step_bench\` on the MPI backend and on
Gloo, and \`bench/pp_pytorch.py\` with the venv's PyTorch on Gloo)

$(bench_record "$BUILD")

Method: the GPT of examples/gpt, *deep* (the main job's width, dim 128, 8 heads, ffn 512, and 8 blocks)
and *small* (4 blocks, dim 32, 4 heads, ffn 128: what a runtime spends per action shows), seq 32, the
corpus's vocabulary; PP=2 (2 ranks, a core each), a batch of 32 sequences in 8 microbatches of 4; the
embeddings with the first blocks and the head with the last, the blocks spread evenly over the stages
(\`even_split_points\`; 2 stages, or 4 for the schedules with 2 per rank); AdamW (lr 3e-3, weight decay
0.01); one intra-op thread per rank. A step is the schedule's forward, backward and loss, the optimizer
step and zeroing the gradients, after a barrier; its time is the maximum over ranks; median and middle
half over $ROUNDS rounds of 3 steps. *dtensor*: \`PipelineRunner\` with the schedule builders'
schedules (\`examples/gpt/pipeline.h\`'s pieces). *hand-written*: the same stages, a plain 1F1B loop over
the mesh's c10d process group (isend, blocking recv, shapes known in advance; bench/pp_step_bench.cpp).
The dtensor runs and the hand-written one run in the same processes, taking turns round by round; every
one starts from the same seed and must give the same first loss. *Compute floor*: each rank's 1F1B stage
runs every microbatch's forward and backward with nothing else (stand-in activations and gradients of the
transfers' shapes; no transfer, no optimizer step; both ranks at once, a core each, as in the runs): the
compute a step of this split holds, which a pipeline step on these kernels adds transfers, bubbles and
the optimizer to (the interleaved split gives each rank as many blocks, and the same ends). *PyTorch*: \`torch.distributed.pipelining\`
(\`PipelineStage\`, \`Schedule1F1B\`, \`ScheduleInterleaved1F1B\`) on the same model and split
(\`scripts/export_test_models.py\` mirrors the C++ GPT), its own processes. *Bubble*: per rank, the time of the
schedule's part of the step (forwards, backwards and transfers, without the optimizer; the slowest
rank's) not spent computing (forwards with the loss, backwards: the runner's \`compute_seconds()\`; timed
the same way in the hand-written loop), over that part, averaged over ranks, against (p-1)/(vm+p-1) for v
stages per rank, which assumes equal stages and free transfers. *Peak activations*: the most bytes the
step's forward and backward hold beyond what the rank held before it (a counting wrapper around
LibTorch's CPU allocator), the maximum over ranks; 1F1B keeps at most p microbatches' activations where
GPipe keeps all m.

| model | backend | implementation | schedule | stages | step ms | middle half | bubble, measured | bubble, (p-1)/(vm+p-1) | peak activations MiB |
| --- | --- | --- | --- | --: | --: | --: | --: | --: | --: |
HEADER
  for config in deep small; do
    for backend in default gloo; do bench_rows $backend --config $config --rounds "$ROUNDS"; done
    "$PYTHON" "$ROOT/bench/pp_pytorch.py" --config $config --rounds "$ROUNDS" 2>/dev/null
  done
  echo
  sed 's/^/- /' "$NOTES"
  echo
  echo "Against PyTorch's pipelining (step time over its step; PyTorch on Gloo, PP=2; the compute floor is no step, but the compute one holds):"
  echo
  against_pytorch "$RESULTS.tmp"
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
