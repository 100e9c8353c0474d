#!/usr/bin/env bash
# Node-local checkpoints across nodes that share no file system: saved by 2 nodes x 2 ranks (TP=4),
# each node writing into its own disk; then loaded on 3 nodes x 2 ranks (DP2 x TP3), node 2 holding
# none of the files. Every rank's shards must equal the saved tensors bit for bit, the bytes each rank
# received exactly what its node lacks (checkpoint_job checks both), and the bytes that crossed between
# nodes the least possible: each element once per node that needs it and lacks it.
#   node_local_checkpoint.sh PYTHON CHECKPOINT_JOB
set -uo pipefail
source "$(dirname "$0")/cluster.sh"
python=$1 job=$2
cluster_with_logs 3
export DTENSOR_BACKEND=gloo DTENSOR_TIMEOUT_S=30
dir=$(node_disk)/checkpoint
files_on() { LC_ALL=C ls "$CLUSTER_DISKS/node$1/checkpoint" 2>/dev/null | tr '\n' ' '; }

RUN_NODES="0 1" start_torchrun "$python" 2 "$logs/save" "$job" save "$dir"
for i in 1 2; do wait -n || fail "the save failed"; done
index="model.safetensors.index.json"
[[ $(files_on 0) == "dtensor.commit model-00001-of-00004.safetensors model-00002-of-00004.safetensors $index " ]] ||
  fail "node 0's disk holds: $(files_on 0)"
[[ $(files_on 1) == "dtensor.commit model-00003-of-00004.safetensors model-00004-of-00004.safetensors $index " ]] ||
  fail "node 1's disk holds: $(files_on 1)"
[[ -z $(files_on 2) ]] || fail "node 2, not in the save, has files: $(files_on 2)"
grep -q '"model-00003-of-00004.safetensors": "node1"' "$CLUSTER_DISKS/node0/checkpoint/$index" ||
  fail "node 0's index does not say that node1 holds rank 2's file"
echo "saved: node0 holds $(files_on 0); node1 holds $(files_on 1)"

start_torchrun "$python" 2 "$logs/load" "$job" load "$dir"
for i in 1 2 3; do wait -n || fail "the load failed"; done
out=$(cat "$logs"/load*.log)
grep "^rank .* on node" <<<"$out"
(($(grep -c "bit for bit" <<<"$out") == 6)) || fail "not every rank loaded its shards bit for bit"
across=$(grep -o "[0-9]* of them across nodes" <<<"$out" | awk '{s += $1} END {print s}')
least=$(grep -o "across nodes at least [0-9]*" <<<"$out" | awk '{print $5}')
((across == least)) || fail "$across bytes crossed between nodes; the least possible is $least"
echo "PASS: loaded bit for bit on 3 nodes (DP2 x TP3) from 2 nodes' disks; $across bytes crossed between nodes, the least possible $least"
