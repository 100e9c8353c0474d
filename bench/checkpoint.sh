#!/usr/bin/env bash
# Checkpoint throughput per rank against plain file I/O, a whole safetensors file loaded into TP=4,
# and (as root) a node-local load's bytes across nodes against the least possible; writes
# bench/results/checkpoint.md.
#   bench/checkpoint.sh <build-dir> [--mb M] [--rounds R] [--dir DIR]     (what `./dev bench checkpoint` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/checkpoint.sh <build-dir> [--mb M] [--rounds R] [--dir DIR]}
shift
RESULTS=$ROOT/bench/results/checkpoint.md
{
  cat <<EOT
# Checkpoints: dtensor save/load against plain file I/O of the same bytes (4 ranks, CPU)

Command: \`./dev bench checkpoint${*:+ $*}\` (runs \`bench/checkpoint.sh\`, which runs \`dtensor_checkpoint_bench${*:+ $*}\`)

$(bench_record "$BUILD")
- Files under: $(df -h --output=source,fstype "${TMPDIR:-/tmp}" | tail -1)

Method: 4 local ranks; a time runs from a barrier all ranks leave together until the closing barrier
(a job goes on once every rank is done), the mean over ranks, medians over rounds. Every round writes
new files (a new checkpoint directory, new plain files), as a job saving step after step does; the
previous round's are removed outside the timing. *save*: \`checkpoint::save\` (each rank's shards into its safetensors file under a
temporary name, fsync, rename, directory fsync, the ranks' agreement, rank 0's index and commit marker).
Its baseline: the same bytes written with write(2) into one file and fsync'd; which of the two goes
first alternates by round. *load*: \`checkpoint::load\` (every file's header, the ranks' agreement,
then only this rank's byte ranges: pread straight into the shard for long runs, copies from the
file's mapping for short ones). Its baseline: pread of the same bytes from the plain file. Reads come
from the page cache in both. Goal: dtensor >= 0.8x plain file I/O. *stall*: the time until
\`checkpoint::save_async\` returns (the same save's collectives and a staging copy of each rank's
shards), against the blocking save; the background write then runs to its commit.

EOT
  if [[ $# -gt 0 ]]; then
    "$BUILD/bench/dtensor_checkpoint_bench" "$@"
  else
    for mb in 256 1024; do
      echo "## $mb MiB in all"
      echo
      "$BUILD/bench/dtensor_checkpoint_bench" --mb "$mb"
      echo
    done
  fi
  # Node-local: across network namespaces (root), the multi-node test's job with 2000x longer tensors.
  if [[ $# -eq 0 && $(id -u) == 0 ]]; then
    python=$(sed -n 's/^DTENSOR_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
    echo "## Node-local load across nodes: bytes moved against the least possible"
    echo
    echo "Saved by 2 nodes x 2 ranks (TP=4), each node on its own disk; loaded on 3 nodes x 2 ranks as"
    echo 'DP2 x TP3, node 2 holding no file (`tests/multinode/node_local_checkpoint.sh` with'
    echo "DTENSOR_TEST_SCALE=2000: 74000 x 23 and 58000 x 41 float, 100000 float, 66000 x 16 bf16, and a plain"
    echo "tensor). The least possible across nodes: each distinct box of the loaded layout once per node"
    echo "whose ranks hold it, less what that node's disk holds (checkpoint_job computes it from the layouts)."
    echo
    echo '```'
    DTENSOR_TEST_SCALE=2000 "$ROOT/tests/multinode/node_local_checkpoint.sh" "$python" "$BUILD/tests/multinode_checkpoint_job" |
      grep -E "^rank .* on node|^PASS|^FAIL"
    echo '```'
  fi
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
