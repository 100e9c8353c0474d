#!/usr/bin/env bash
# Runs the fully-sharded training-step benchmark (bench/fsdp_bench.cpp: dtensor's fully_shard next to a
# hand-written ZeRO-3 over raw c10d) and PyTorch's own fully_shard (bench/fsdp_pytorch.py) on the same
# GPT configurations, and writes bench/results/fsdp.md.
#   bench/fsdp.sh <build-dir> [--rounds R]      (what `./dev bench fsdp` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/fsdp.sh <build-dir> [--rounds R]}
shift
ROUNDS=10
if [[ ${1:-} == --rounds ]]; then ROUNDS=$2; fi
LARGE_ROUNDS=$(( (ROUNDS + 1) / 2 ))
PYTHON=$(sed -n 's/^DTENSOR_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
RESULTS=$ROOT/bench/results/fsdp.md
BENCH=$BUILD/bench/dtensor_fsdp_bench
RATIOS=$(mktemp)
trap 'rm -f "$RATIOS"' EXIT

# dtensor_rows LABEL BACKEND ARGS...: the bench's table rows on stdout, the implementation column of
# dtensor's row suffixed with LABEL; its per-round ratio line goes to $RATIOS.
dtensor_rows() {
  local label=$1 backend=$2 out
  shift 2
  out=$(on_backend "$backend" "$BENCH" "$@")
  grep '^|' <<<"$out" | sed "s/| dtensor fully_shard |/| dtensor fully_shard$label |/"
  grep '^Ratio' <<<"$out" >>"$RATIOS" || true
}

# against_pytorch TABLE: for each model, dtensor's, the hand-written ZeRO-3's and the compute floor's step
# time over PyTorch's (FSDP=4, Gloo), read from the rows written so far.
against_pytorch() {
  awk -F' *\\| *' '
    { key = $2 "|" $3 "|" $4 "|" $5; if (!(key in ms)) ms[key] = $6 }
    $4 ~ /^compute floor/ { floor[$2] = $6 }
    END {
      split("demo large", models, " ")
      for (i = 1; i <= 2; i++) {
        m = models[i]; pt = ms[m "|FSDP=4|PyTorch fully_shard|gloo"]
        if (pt == "") continue
        printf "- %s: dtensor fully_shard (alone) %.2f, hand-written ZeRO-3 %.2f, compute floor %.2f\n", m,
          ms[m "|FSDP=4|dtensor fully_shard (alone)|gloo"] / pt, ms[m "|FSDP=4|hand-written ZeRO-3|gloo"] / pt,
          floor[m] / pt
      }
      split("FSDP=2 x TP=2|HSDP: 2 replicas x FSDP=2", layouts, "|")
      for (i = 1; i <= 2; i++) {
        pt = ms["demo|" layouts[i] "|PyTorch fully_shard|gloo"]
        if (pt != "") printf "- demo %s: dtensor fully_shard (alone) %.2f\n", layouts[i], ms["demo|" layouts[i] "|dtensor fully_shard (alone)|gloo"] / pt
      }
    }' "$1"
}

{
  cat <<EOF
# GPT training step, fully sharded data parallel: dtensor vs hand-written ZeRO-3 vs PyTorch FSDP2 (CPU)

Command: \`./dev bench fsdp${*:+ $*}\` (runs \`bench/fsdp.sh\`: \`dtensor_fsdp_bench\` on the MPI backend and on
Gloo, and \`bench/fsdp_pytorch.py\` with the venv's PyTorch on Gloo)

$(bench_record "$BUILD")

Method: the GPT of examples/gpt (demo: seq 32, dim 128, 8 heads, 2 layers, ffn 512, the corpus's
vocabulary, 0.41M parameters; large: dim 512, 8 heads, 8 layers, ffn 2048, 25.3M parameters), 4 local
ranks on these $(nproc) cores (oversubscribed: times include ranks waiting for a core; the FSDP=2 rows at
the end run 2 ranks, a core each), one intra-op
thread per rank, each rank with its own batch of 8, AdamW (lr 3e-3, weight decay 0.01), fully_shard on
each block and on the root. A step is forward, backward, the optimizer step, zero_grad and reading the
loss, after a barrier. *dtensor*: \`gpt::fully_shard\` (reshard_after_forward and overlap on unless the
row says off; overlap: the next group's all-gather started before this one computes, in forward and
backward, and one group's reduce-scatter left in flight until the next starts or the gradients are
read), \`dtensor::step_on_local_shards\` with \`fused\` on (AdamW in ATen's fused kernel, which the
hand-written run uses as well). *hand-written ZeRO-3*: FSDP1's flat parameter over raw c10d
(\`bench/fsdp_bench.cpp\`): one all-gather per group before its forward, straight into the flat buffer
the parameters are views of, never freed (so it gathers once per step, as fully_shard with
reshard_after_forward off does), gradients accumulated by autograd into a flat buffer and
reduce-scattered per group after backward, AdamW on the flat shards; its losses must equal dtensor's
in the warm-up steps. The two run in the same processes, alternating rounds of 3 steps ($ROUNDS rounds,
$LARGE_ROUNDS for the large model), so their peak RSS is that of both: the "alone" rows measure
dtensor's. *PyTorch FSDP2*: \`torch.distributed.fsdp.fully_shard\` on the same model from the same seed
(\`scripts/export_test_models.py\` mirrors the C++ GPT), random tokens, 3 warm-up and $ROUNDS x 3 timed
steps; with TP=2 its Megatron plan gathers the logits (dtensor's keeps them class-sharded into the
loss). *HSDP* rows: fully_shard on a 2 x 2 mesh of replicas x dp (PyTorch's: \`("replicate", "shard")\`),
every rank on its own batch: gathers within dp, gradients reduce-scattered over dp, then all-reduced
over the replicas (dtensor's reduce-scatter blocks before that all-reduce starts). Step time: rank 0's, median and middle half over the timed steps. Peak RSS: the largest
\`ru_maxrss\` over ranks (each process's whole footprint: LibTorch, Python for PyTorch, the model).
The hand-written run's collectives all block. With 4 ranks on $(nproc) cores there is no idle core for
a transfer to run on while another computes, so overlap can only hide waiting on peers, not
transfer time: on a GPU, NCCL's transfers run on their own stream and the overlap is what it is built
for.

| model | layout | implementation | backend | step ms | middle half | peak RSS per rank, MiB |
| --- | --- | --- | --- | --- | --- | --- |
EOF
  for backend in default gloo; do
    dtensor_rows "" $backend --config demo --rounds "$ROUNDS"
    dtensor_rows ", reshard after forward off" $backend --config demo --reshard 0 --rounds "$ROUNDS"
    dtensor_rows ", overlap off" $backend --config demo --overlap 0 --rounds "$ROUNDS"
    dtensor_rows " (alone)" $backend --config demo --impl dtensor --rounds "$ROUNDS"
    dtensor_rows " (alone)" $backend --config demo --tp 2 --rounds "$ROUNDS"
    dtensor_rows " (alone)" $backend --config demo --replicas 2 --rounds "$ROUNDS"
  done
  "$PYTHON" "$ROOT/bench/fsdp_pytorch.py" --config demo --rounds "$ROUNDS"
  "$PYTHON" "$ROOT/bench/fsdp_pytorch.py" --config demo --tp 2 --rounds "$ROUNDS"
  "$PYTHON" "$ROOT/bench/fsdp_pytorch.py" --config demo --replicas 2 --rounds "$ROUNDS"
  dtensor_rows "" default --config demo --impl floor --rounds "$ROUNDS"
  for backend in default gloo; do
    dtensor_rows ", reshard after forward off" $backend --config large --reshard 0 --rounds "$LARGE_ROUNDS"
    dtensor_rows " (alone)" $backend --config large --impl dtensor --rounds "$LARGE_ROUNDS"
    dtensor_rows " (alone), overlap off" $backend --config large --impl dtensor --overlap 0 --rounds "$LARGE_ROUNDS"
  done
  "$PYTHON" "$ROOT/bench/fsdp_pytorch.py" --config large --rounds "$LARGE_ROUNDS"
  dtensor_rows "" default --config large --impl floor --rounds "$LARGE_ROUNDS"
  # A core to each rank: dtensor's own work is not hidden behind ranks waiting for a core.
  dtensor_rows ", reshard after forward off" default --config demo --reshard 0 --ranks 2 --rounds "$ROUNDS"
  dtensor_rows ", reshard after forward off" default --config large --reshard 0 --ranks 2 --rounds "$LARGE_ROUNDS"
  echo
  echo "dtensor over hand-written, per round (the two in the same processes, back to back; medians of each"
  echo "round's steps):"
  echo
  sed 's/^/- /' "$RATIOS"
  echo
  echo "Against PyTorch's fully_shard (step time over its step, FSDP=4 on Gloo; the compute floor and the"
  echo "hand-written ZeRO-3 bound what any implementation can reach here):"
  echo
  against_pytorch "$RESULTS.tmp"
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
