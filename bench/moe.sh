#!/usr/bin/env bash
# Runs the MoE benchmark (bench/moe_bench.cpp: dtensor's expert-parallel MoE layer against a
# hand-written all-to-all MoE over raw c10d, tensor parallelism of the same experts and one process)
# with EP = 4 on the MPI backend and on Gloo, and writes bench/results/moe.md.
#   bench/moe.sh <build-dir> [--rounds R]      (what `./dev bench moe` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/moe.sh <build-dir> [--rounds R]}
shift
ROUNDS=20
if [[ ${1:-} == --rounds ]]; then ROUNDS=$2; fi
RESULTS=$ROOT/bench/results/moe.md

{
  cat <<HEADER
# Mixture of experts under expert parallelism (CPU)

Command: \`./dev bench moe${*:+ $*}\` (runs \`bench/moe.sh\`: \`dtensor_moe_bench --ranks 4 --rounds $ROUNDS\` on the MPI
backend and on Gloo)

$(bench_record "$BUILD")

Method: one MoE layer (hidden 256, 8 SwiGLU experts of 512 features, top 2 with Mixtral's routing, float),
1024 tokens per rank, forward and backward from a fixed output gradient, after a barrier; a step's time
is the slowest rank's; median and middle half over $ROUNDS rounds. Each round runs, in rotating order,
*dtensor MoE, EP* (\`dtensor::MoE\` with \`expert_parallel\` over a 4-rank ep mesh, 2 experts per rank,
each rank its own tokens), the *hand-written* MoE over raw c10d (the same routing, dispatch and grouped
matrix multiply, its all-to-alls posted on the process group directly: what a torchtitan user writes),
*tensor parallel experts* (every rank all 8 experts with a quarter of each one's features; every rank's
tokens all-gathered, the outputs reduce-scattered back), then *one process* (rank 0 alone on every
rank's tokens with one intra-op thread per core while the others wait on the store). The ratio column
is dtensor's step over the method's within each round (the goal against the hand-written one: at most
1.05). Before timing, every method's output must match dtensor's (relative 1e-4). 4 ranks share this
machine's $(nproc) cores, so the parallel methods take turns on them.

HEADER
  for backend in default gloo; do
    on_backend "$backend" "$BUILD/bench/dtensor_moe_bench" --ranks 4 --rounds "$ROUNDS"
    echo
  done
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
