#!/usr/bin/env bash
# Collective bandwidth, MPI backend against Gloo and memcpy, at 2 and 4 ranks; writes
# bench/results/collectives.md.
#   bench/collectives.sh <build-dir> [--max-mib M] [--seconds S]     (what `./dev bench collectives` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/collectives.sh <build-dir> [--max-mib M] [--seconds S]}
shift
RESULTS=$ROOT/bench/results/collectives.md
{
  cat <<EOT
# Collective bandwidth: dtensor's MPI backend against Gloo and memcpy (one host, CPU)

Command: \`./dev bench collectives${*:+ $*}\` (runs \`bench/collectives.sh\`, which runs \`dtensor_collectives_bench --ranks N${*:+ $*}\` for N = 2, 4)

$(bench_record "$BUILD")

Method: one job of N local ranks started through mpirun (dtensor's launcher), one intra-op thread per
rank, two 1-d meshes over the same ranks: one on Gloo (TCP over loopback), one on the MPI backend
(Open MPI, shared memory). Float32 tensors; bandwidth is the whole tensor's bytes over the time
(nccl-tests' algorithm bandwidth): an all-gather's output, an all-reduce's tensor, a reduce-scatter's
or all-to-all's input. A time is the slowest rank's, from a barrier, for one call through the c10d
backend, the median over repetitions (at least 3, up to 0.5 s); which backend goes first alternates.
*memcpy, 1 process*: rank 0 copies the same number of bytes (at::Tensor::copy_) while the other
ranks sleep, the median of its repetitions: one process's copy bandwidth on this host (the goal's
baseline). *memcpy, every rank*: every rank copies that many bytes at once, timed like a collective:
what a one-host all-gather, in which every rank writes the whole tensor, can reach at best when the
ranks share the memory bandwidth. Goal: all-gather >= 0.6x memcpy.

EOT
  for ranks in 2 4; do
    echo "## $ranks ranks"
    echo
    "$BUILD/bench/dtensor_collectives_bench" --ranks "$ranks" "$@"
    echo
  done
  cat <<EOT
## Open MPI's own collectives, for comparison

The MPI backend's all-gathers, and all-reduces under 256 KiB, go through shared memory
(src/mesh/mpi/mpi_shared_memory.h); \`DTENSOR_MPI_SHARED_MEMORY=0\` leaves them to MPI
(MPI_Iallgather, MPI_Iallreduce). The same benchmark with it, run right after the tables above (so
its ratios compare across two runs, not within one):

EOT
  for ranks in 2 4; do
    DTENSOR_MPI_SHARED_MEMORY=0 "$BUILD/bench/dtensor_collectives_bench" --ranks "$ranks" "$@" | grep -E '^\| (operation|---|all-gather|all-reduce)'
    echo
  done
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
