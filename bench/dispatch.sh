#!/usr/bin/env bash
# Runs the dispatch-overhead benchmark and writes bench/results/dispatch.md.
#   bench/dispatch.sh <build-dir> [--iterations N]      (what `./dev bench dispatch` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/dispatch.sh <build-dir> [--iterations N]}
shift
RESULTS=$ROOT/bench/results/dispatch.md
{
  cat <<EOF
# Dispatch overhead per op (CPU)

Command: \`./dev bench dispatch\` (runs \`bench/dispatch.sh\`, which runs \`dtensor_dispatch_bench\`)

$(bench_record "$BUILD")

Method: one rank (a mesh of one, so no communication), one intra-op thread. Each op runs on DTensors
(first input Shard(0), second Replicate) and on their local tensors, in the same process; cache-hit
times are medians over 15 batches of calls. The first call is timed after clearing the propagation
cache (median of 50): it includes the op's meta computation on the global shapes (or, for ops without
a Meta kernel such as relu, running it on expanded-zero stand-ins), the strategy search and the op.
Goals: <= 2 µs added per op on a cache hit, <= 30 µs on a miss. The second table adds autograd: a small
training step on DTensors and on plain tensors, and what dtensor adds per DTensor op it dispatches
(forward and backward ops; autograd's bookkeeping of the wrapper tensors included).

EOF
  "$BUILD/bench/dtensor_dispatch_bench" "$@"
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
