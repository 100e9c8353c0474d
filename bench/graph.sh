#!/usr/bin/env bash
# Runs the graph benchmarks (forward: graph TP; training step: SPMD expansion of the joint program)
# for TP = 2, 4 and writes bench/results/graph.md.
#   bench/graph.sh <build-dir> [--rounds R]      (what `./dev bench graph` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/graph.sh <build-dir> [--rounds R]}
shift
RESULTS=$ROOT/bench/results/graph.md
MODEL=$BUILD/graph_models/gpt_train_ir_static.pt2
JOINT=$BUILD/graph_models/gpt_joint.pt2
{
  cat <<EOT
# GPT under tensor parallelism from exported graphs vs eager module-level TP vs hand-written Megatron (CPU)

Command: \`./dev bench graph${*:+ $*}\` (runs \`bench/graph.sh\`, which runs \`dtensor_graph_bench --model <build>/graph_models/$(basename "$MODEL") --tp N${*:+ $*}\`
and \`dtensor_graph_bench --train --model <build>/graph_models/$(basename "$JOINT") --tp N${*:+ $*}\` for N = 2, 4)

$(bench_record "$BUILD")

Method: the GPT demo model (vocab 42, seq 32, dim 128, 8 heads, 2 layers, ffn 512, batch 8) exported
from Python with torch.export (training IR; \`scripts/export_test_models.py\`), one intra-op thread
per rank, over the launcher's default backend (the MPI backend through mpirun when dtensor has it;
Gloo over loopback with \`DTENSOR_BACKEND=gloo\`). All three compute the whole logits on every rank from the exported
weights and are checked equal to the single-process program before timing. *graph TP*: the program
transformed by \`dtensor::graph::tensor_parallel_transform\` with the demo's TP plan (LM head column-
parallel, its classes gathered at the end), run by the graph interpreter. *eager module-level TP*:
\`gpt::parallelize\` and \`model->logits\`, then \`full_tensor\`. *hand-written Megatron*: per-rank shards
and raw c10d all-reduces, logits all-gathered. Rounds of 5 forwards each, order rotating, a barrier
before every forward; a forward's time is the maximum over ranks; medians. Goal: graph TP <= 1.0x the
hand-written forward.

Training step: the same model's loss (mean cross-entropy), gradients and an AdamW step (lr 1e-3) on
a fixed batch. *graph SPMD*: the joint forward+backward program (\`torch.export.experimental.
_export_forward_backward\`, core ATen) expanded by \`dtensor::graph::spmd_expand\` from the plan's
parameter placements, one \`joint_step\` (the program: loss, gradients and their collectives) and
\`AdamW::step\` on the local shards. *eager module-level TP*: \`gpt::parallelize\`, forward, backward,
AdamW. *hand-written Megatron*: \`megatron::MegatronGpt\` (f/g autograd functions over raw c10d,
vocabulary-parallel cross-entropy), backward, AdamW. First losses checked against the single-process
program (rel 1e-4). Same timing method. Goal: graph SPMD <= 1.0x hand-written. Also the expanded step's
peak of live activation bytes per rank with and without freeing each value after its last use.

EOT
  for tp in 2 4; do
    echo "## Forward, TP=$tp"
    echo
    "$BUILD/bench/dtensor_graph_bench" --model "$MODEL" --tp "$tp" "$@"
    echo
  done
  for tp in 2 4; do
    echo "## Training step, TP=$tp"
    echo
    "$BUILD/bench/dtensor_graph_bench" --train --model "$JOINT" --tp "$tp" "$@"
    echo
  done
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
