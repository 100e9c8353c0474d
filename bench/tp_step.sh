#!/usr/bin/env bash
# Runs the tensor-parallel training-step benchmark for TP = 1, then 2 and 4 on the MPI backend (when
# dtensor has it) and on Gloo, then TP=2 with the hand-written run's all-reduces skipped (the bound on
# TP's speedup), and writes bench/results/tp_step.md.
#   bench/tp_step.sh <build-dir> [--rounds R]      (what `./dev bench tp` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/tp_step.sh <build-dir> [--rounds R]}
shift
RESULTS=$ROOT/bench/results/tp_step.md
CORES=$(nproc)
oversubscribed=""
if ((CORES < 4)); then oversubscribed=" TP=4 runs 4 ranks on these $CORES cores (oversubscribed), so its times include ranks waiting for a core."; fi
{
  cat <<EOF
# GPT training step, tensor parallel: dtensor vs hand-written Megatron (CPU, MPI and Gloo)

Command: \`./dev bench tp${*:+ $*}\` (runs \`bench/tp_step.sh\`, which runs \`dtensor_tp_step_bench --tp N${*:+ $*}\` for N = 1, then 2 and 4 with the launcher's default backend (MPI through mpirun) and with \`DTENSOR_BACKEND=gloo\`)

$(bench_record "$BUILD")
$oversubscribed

Method: the GPT demo model (examples/gpt: seq 32, dim 128, 8 heads, 2 layers, ffn 512, the corpus's
vocabulary, batch 8), every model from the same seed, local ranks talking through the MPI backend
(Open MPI, shared memory) or Gloo (TCP over loopback), one intra-op thread per rank. A step is forward, backward, AdamW step (\`dtensor::step_on_local_shards\`:
LibTorch's AdamW over the local shards of DTensor parameters, \`optimizer.step()\` for plain ones) and
zero_grad, then reading the loss as a number (what a training loop logs); no gradient clipping. *dtensor*: \`gpt::parallelize\`
on a 1-d mesh (the TP plan with local activations), \`dtensor::call(model, tokens, targets)\`.
*hand-written Megatron*: the same GPT as plain per-rank shards of the same weights, Megatron's f/g
autograd functions over the mesh's c10d process group (all-reduces in place, skipped on one rank as
Megatron does), a vocabulary-parallel embedding and cross-entropy (all-reduces of the row max, the
target logit and the sum of exponentials); its linear layers compute with \`at::linear\` (one addmm over
the flattened input; a row-parallel layer adds its bias after the all-reduce), the kernels dtensor's
parallel Linears run on their shards (dtensor runs a \`torch::nn::Linear\` with DTensor parameters as one
\`aten::linear\` op). *plain
LibTorch*: gpt::Gpt without dtensor (torch::nn::Linear's own forward), in one process;
at TP>1 rank 0 runs it alone, with one intra-op thread and with one per core, while the other ranks
sleep in a store wait (they take no core), in the same rounds as the parallel runs.
Before timing, both parallel runs' first-step losses must equal the single process's (relative 1e-5)
and their warm-up losses after updates each other's (1e-4). After 5 warm-up steps each, the
implementations alternate in rounds of 5 steps each, 20 rounds by default: dtensor and hand-written step by step in turn (which goes first alternating), then the single-process runs, so that each parallel run follows each single-process run equally often (the step after one pays for it: the other ranks wake from a wait). Every step
starts after a barrier; a step's time is the maximum over ranks, and each column is the median over
steps of that phase's time (maximum over ranks), so phases need not add up to the step. Under each table, the
ratio of dtensor's to hand-written's step within each round (medians of the round's 5 steps; the two
take turns, so load that drifts over seconds cancels out): its median with the median's 95% confidence
interval (order statistics, no distribution assumed) and its middle half over rounds, the spread to
read the table's ratio with; a goal inside the interval is not resolved by the run. Collectives
are counted over one step on rank 0 (dtensor's with CommDebugMode). Goals: dtensor's step
<= 1.02x the hand-written one on the same backend at TP=2 and TP=4; on MPI at TP=2, at least 1.2x the
tokens/s of one process using every core.

EOF
  echo "## TP=1"
  echo
  "$BUILD/bench/dtensor_tp_step_bench" --tp 1 "$@"
  echo
  for tp in 2 4; do
    for backend in default gloo; do
      if [[ $backend == gloo ]]; then echo "## TP=$tp, Gloo"; else echo "## TP=$tp, launcher's default backend"; fi
      echo
      on_backend "$backend" "$BUILD/bench/dtensor_tp_step_bench" --tp "$tp" "$@"
      echo
    done
  done
  echo "## TP=2, launcher's default backend, hand-written with its all-reduces skipped: the bound"
  echo
  echo "The same run with DTENSOR_BENCH_SKIP_ALL_REDUCES=1: once the losses are checked, the hand-written"
  echo "steps skip their all-reduces (their values are wrong from then on). Its tokens/s over the single"
  echo "process is what tensor parallelism gains on this machine from splitting the per-rank compute alone,"
  echo "with communication free; the 1.2x goal can be no nearer than that."
  echo
  DTENSOR_BENCH_SKIP_ALL_REDUCES=1 "$BUILD/bench/dtensor_tp_step_bench" --tp 2 "$@"
  echo
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
