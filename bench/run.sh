#!/usr/bin/env bash
# Runs the redistribute benchmark on 2 and 4 local ranks and writes bench/results/redistribute.md.
#   bench/run.sh <build-dir> [flags]      (what `./dev bench [flags]` calls)
# Flags go to dtensor_redistribute_bench, e.g. `--sizes-mib 1,4,16 --seconds 0.3` for a quick run.
# DTENSOR_BENCH_RESULTS names another results file (so a quick run need not replace the full one).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/run.sh <build-dir> [benchmark flags]}
shift
BIN=$BUILD/bench/dtensor_redistribute_bench
RESULTS=${DTENSOR_BENCH_RESULTS:-$ROOT/bench/results/redistribute.md}

header() {
  cat <<EOF
# Redistribute throughput vs raw c10d (CPU; the launcher's default backend: MPI when dtensor has it)

Command: \`./dev bench${*:+ $*}\` (runs \`bench/run.sh\`, which runs \`dtensor_redistribute_bench --ranks N\` for N = 2, 4)

$(bench_record "$BUILD")

Method: all ranks are local processes on this machine, talking through the backend each section names
(MPI through mpirun by default; \`DTENSOR_BACKEND=gloo ./dev bench redistribute\` for Gloo), on a
1-d mesh of N ranks. *MiB/rank* is the size of each rank's local input, a float32 [rows, 1024]
tensor (even shards, no padding). Each DTensor \`redistribute\` call is timed next to the c10d call a
hand-written program would make for the same bytes, interleaved in the same process (alternating
which goes first), each after a barrier; the figures are rank 0's medians. The baselines allocate
their output like \`redistribute\` must; the all-reduce runs in place. *P->R* (not donated) must leave
its input intact: on MPI the all-reduce reads it and writes a new tensor (no copy first), on Gloo a
copy is reduced in place. *P->R (donated)* moves the
DTensor in (\`redistribute(std::move(dt), ...)\`), which donates its buffer so the all-reduce runs in
place too; each call then wraps the result's buffer as the next call's input (timed with the call).
S(0)->S(1) has two baselines: \`all_to_all_single\` on the input as is moves the same bytes, but row
blocks rather than the column blocks S(1) needs (a bound: with \`all_to_all_single\`'s one contiguous
send buffer no correct program reaches it); *pack + all_to_all_single* first packs the column blocks
into that buffer, as a hand-written program must. On MPI with shared memory (one host, ranks no more
than cores) dtensor hands the column blocks to c10d's list \`alltoall\` as views, copied straight into
the shared slots (a memcpy per row), so it moves the bytes the first baseline moves, but reads them
strided. Where ranks outnumber cores the
all-to-all is Open MPI's, which takes one contiguous buffer, so dtensor packs as the second baseline
does. Throughput is input bytes per rank / median time.
*ratio* = raw median / DTensor median (goal >= 0.95; bold when below);
*ratio of best* = fastest raw call / fastest DTensor call (other load only adds time).
Planning: \`plan_redistribute\` is the pure planner; \`redistribute_plan\` is the path
\`redistribute\` takes (placement validation and the per-thread plan cache), mean per call.

EOF
}

run_all() {
  header "$@"
  for ranks in 2 4; do
    echo "## $ranks ranks"
    echo
    "$BIN" --ranks "$ranks" "$@"
  done
  echo "Load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
}

mkdir -p "$(dirname "$RESULTS")"
# Written beside the results and moved into place at the end: a failed run keeps the last results.
tmp=$(mktemp "$RESULTS.XXXXXX")
trap 'rm -f "$tmp"' EXIT
run_all "$@" | tee "$tmp"
mv "$tmp" "$RESULTS"
chmod 644 "$RESULTS"
echo "wrote $RESULTS" >&2
