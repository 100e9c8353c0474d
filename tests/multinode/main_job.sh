#!/usr/bin/env bash
# The main job across nodes: main_job.sh torchrun|mpirun NODES RANKS_PER_NODE PYTHON GPT_TRAIN [ARGS...]
# (RANKS_PER_NODE: "2" on every node, or one count per node: "2,1,1")
# PASS when every node's launcher exits 0 and rank 0 prints the main job's verdict.
set -uo pipefail
source "$(dirname "$0")/cluster.sh"
launcher=$1 nodes=$2 per_node=$3 python=$4
shift 4
cluster_up "$nodes"
logs=$(mktemp -d)
export DTENSOR_TIMEOUT_S=60
status=0
if [[ $launcher == torchrun ]]; then
  export DTENSOR_BACKEND=gloo
  start_torchrun "$python" "$per_node" "$logs/node" "$@"
  for ((i = 0; i < nodes; i++)); do wait -n || status=1; done
else
  run_mpirun "$per_node" "$@" >"$logs/node0.log" 2>&1 || status=1
fi
for ((i = 0; i < nodes; i++)); do
  [[ -f $logs/node$i.log ]] && { echo "== node$i"; grep -v "socket.cpp:.*hostname of the client socket" "$logs/node$i.log"; }
done
grep -q "PASS: every loss trajectory" "$logs/node0.log" || status=1
rm -rf "$logs"
cluster_down || status=1
((status == 0)) && echo "PASS: the main job across $nodes nodes x $per_node ranks ($launcher)"
exit $status
