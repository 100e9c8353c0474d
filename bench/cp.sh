#!/usr/bin/env bash
# Runs the context-parallel attention benchmark (bench/cp_bench.cpp: dtensor's ring and all-to-all
# attention against one process holding the whole sequence) with CP = 2 and 4 on the MPI backend and on
# Gloo, and tries PyTorch's own context_parallel (bench/cp_pytorch.py) on Gloo, and writes
# bench/results/cp.md.
#   bench/cp.sh <build-dir> [--rounds R]      (what `./dev bench cp` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/cp.sh <build-dir> [--rounds R]}
shift
ROUNDS=5
if [[ ${1:-} == --rounds ]]; then ROUNDS=$2; fi
PYTHON=$(sed -n 's/^DTENSOR_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
RESULTS=$ROOT/bench/results/cp.md
BENCH=$BUILD/bench/dtensor_cp_bench
NOTES=$(mktemp)
trap 'rm -f "$NOTES"' EXIT

# bench_rows BACKEND ARGS...: the table rows on stdout, with the backend in the method column; the
# paired ratio lines to $NOTES.
bench_rows() {
  local backend=$1 out
  shift
  out=$(on_backend "$backend" "$BENCH" "$@")
  grep '^| [0-9]' <<<"$out" | sed "s/| dtensor \([a-z-]*\) |/| dtensor \1 ($backend) |/; s/(default)/(MPI)/"
  grep '^- ' <<<"$out" | sed "s/^- /- $backend: /; s/^- default:/- MPI:/" >>"$NOTES" || true
}

{
  cat <<HEADER
# Context-parallel attention: ring and all-to-all against one process (CPU)

Command: \`./dev bench cp${*:+ $*}\` (runs \`bench/cp.sh\`: \`dtensor_cp_bench --ranks N\` for N = 2, 4 on the MPI
backend and on Gloo, and \`bench/cp_pytorch.py\` with the venv's PyTorch on Gloo)

$(bench_record "$BUILD")

Method: causal attention forward and backward (\`scaled_dot_product_attention\`, batch 1, 8 query heads, 4
key/value heads, head dim 32, float), the sequence sharded head-tail (load balanced) over a \`cp\` mesh of
N local ranks with one intra-op thread each, by ring and by all-to-all
(\`set_context_parallel_attention\`), against *one process* holding the whole sequence with one intra-op
thread per core of this machine (rank 0 alone while the other ranks sleep on the store). A step makes q,
k and v leaves, runs attention and its backward from a fixed output gradient, after a barrier; its time
is the slowest rank's; median and middle half over $ROUNDS rounds, each round the one process's step
then the ring's and the all-to-all's in turn (which goes first alternating). *Communication share*: the
time each rank spent blocked in dtensor's communication (\`CommunicationTime\`: posting transfers,
waiting for them, collectives) over the step time, averaged over ranks: what overlap did not hide.
Before timing, each method's output and query gradient must match the one process's (relative 1e-4).
CP=4 runs 4 ranks on this machine's $(nproc) cores: its ranks take turns on them.

| positions | CP | method | step ms | middle half | step / one process | communication share |
| --: | --- | --- | --: | --: | --: | --: |
HEADER
  for ranks in 2 4; do
    for backend in default gloo; do bench_rows $backend --ranks $ranks --rounds "$ROUNDS"; done
    for seq in 4096 8192; do "$PYTHON" "$ROOT/bench/cp_pytorch.py" --ranks $ranks --seq $seq --rounds "$ROUNDS" 2>/dev/null; done
  done
  echo
  echo "Ring over all-to-all, step time within each round (paired):"
  echo
  cat "$NOTES"
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
