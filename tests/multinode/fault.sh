#!/usr/bin/env bash
# A fault in a job of 2 nodes x 2 ranks (torchrun, Gloo, DTENSOR_TIMEOUT_S=10), and what the ranks
# that survive it do: fault.sh FAULT PYTHON COLLECTIVE_JOB, FAULT one of
#   partition            node 1's link goes down during training
#   partition-at-groups  node 1's link goes down after the ranks joined, before the mesh's groups exist
#   node-killed          every process on node 1 is killed during training
#   rank-stopped         rank 3 (on node 1) is stopped with SIGSTOP during training (a hung peer)
# PASS when every surviving rank on either side exits within the timeout plus a margin, with one
# dtensor error that names the operation, the mesh dim and each peer it lost with its host, and no
# C++ stack frame or source location anywhere in the output.
set -uo pipefail
source "$(dirname "$0")/cluster.sh"
fault=$1 python=$2 job=$3
timeout_s=10 margin_s=5
cluster_with_logs 2
export DTENSOR_BACKEND=gloo DTENSOR_TIMEOUT_S=$timeout_s DTENSOR_TEST_SECONDS=120
[[ $fault == partition-at-groups ]] && export DTENSOR_TEST_HOLD_DIR=$logs
start_torchrun "$python" 2 "$logs/node" "$job"

wait_for() {  # wait_for DESCRIPTION TEST...: up to 60 s
  local what=$1 k
  shift
  for ((k = 0; k < 300; k++)); do "$@" && return 0; sleep 0.2; done
  fail "the job never got to: $what"
}
all_running() { (($(cat "$logs"/node*.log 2>/dev/null | grep -c ': running$') == 4)); }
all_joined() { (($(ls "$logs" | grep -c '^joined-') == 4)); }
rank_pid() {  # the pid of rank $1 on node $2
  local p
  for p in $(node_processes "$2"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$1" &&
      [[ $(ps -o comm= -p "$p") == "$(basename "$job" | cut -c1-15)" ]] && { echo "$p"; return; }
  done
}

case $fault in
  partition) wait_for "training" all_running; link_down 1; survivors="0 1 2 3"; lost_by_node0="2 3"; lost_by_node1="0 1" ;;
  partition-at-groups)
    wait_for "every rank joined" all_joined
    sleep 2  # a few heartbeats, so that each rank knows where its peers run
    link_down 1; touch "$logs/go"; survivors="0 1 2 3"; lost_by_node0="2 3"; lost_by_node1="0 1" ;;
  node-killed) wait_for "training" all_running; kill_node 1; survivors="0 1"; lost_by_node0="2 3" ;;
  rank-stopped)
    wait_for "training" all_running
    pid=$(rank_pid 3 1); [[ -n $pid ]] || fail "rank 3's process not found"
    kill -STOP "$pid"; survivors="0 1 2"; lost_by_node0="3"; lost_by_node1="3" ;;
  *) echo "unknown fault $fault"; exit 2 ;;
esac

# Every surviving rank's process ends in time. Node 1 is not watched where nothing of it survives, or
# where it keeps the stopped rank (teardown kills it): its rank 2 is checked below.
watched="0 1"
[[ $fault == node-killed || $fault == rank-stopped ]] && watched="0"
times=$logs/exit_times
ranks_exit_times "$(basename "$job" | cut -c1-15)" $((timeout_s + margin_s + 10)) "$times" "$watched"
cat "$times"
for node in $watched; do
  t=$(awk -v n="node$node" '$1 == n { print $2 }' "$times")
  [[ $t != never ]] && (($(echo "$t <= $timeout_s + $margin_s" | bc))) || fail "node$node's ranks took $t s to exit"
done
if [[ $fault == rank-stopped ]]; then  # rank 2, beside the stopped rank 3, must exit too
  # It raises its error when node0's ranks do; its teardown may take a few seconds more on a loaded
  # machine (0.5 s once was not enough while other builds ran).
  for _ in $(seq 20); do [[ -z $(rank_pid 2 1) ]] && break; sleep 0.25; done
  [[ -z $(rank_pid 2 1) ]] || fail "rank 2 is still running 5 s after node0's ranks exited, beside the stopped rank 3"
fi

# Each surviving rank's error: the operation, the mesh dim, each lost peer with its host. torchrun ends
# a node's other ranks (SIGTERM) once one of them fails, so a rank may be ended before it reports; each
# node with survivors must have a report, and a rank without one must have been ended by its agent.
for node in 0 1; do
  [[ " $survivors " == *" $((2 * node)) "* || " $survivors " == *" $((2 * node + 1)) "* ]] || continue
  grep -q "^rank [0-9]: dtensor: " "$logs/node$node.log" || fail "no rank on node$node reported the fault"
done
for r in $survivors; do
  node=$((r / 2))
  line=$(grep -h "^rank $r: dtensor: " "$logs/node$node.log")
  if [[ -z $line ]]; then
    grep -q "Sending process [0-9]* closing signal SIGTERM" "$logs/node$node.log" ||
      fail "rank $r printed no dtensor error and was not ended by torchrun"
    echo "rank $r was ended by torchrun before it reported"
    continue
  fi
  echo "rank $r said: $line"
  if [[ $fault == partition-at-groups ]]; then
    grep -q "creating mesh dim 0 (tp) of DeviceMesh(\[0, 1, 2, 3\], names=(tp)): .*creating the gloo process group" <<<"$line" || fail "rank $r does not say it was creating the tp group"
  else
    grep -qE "(all-reduce|all-gather|reduce-scatter) on mesh dim 0 \(tp\) of DeviceMesh\(\[0, 1, 2, 3\], names=\(tp\)\)" <<<"$line" || fail "rank $r does not name the collective and the mesh dim"
  fi
  lost=$lost_by_node0; ((node == 1)) && lost=$lost_by_node1
  for peer in $lost; do
    grep -q "rank $peer on node$((peer / 2)) (pid [0-9]*)" <<<"$line" || fail "rank $r does not name rank $peer and its host"
  done
  [[ $fault == rank-stopped && $r == 2 ]] && { grep -q "rank 3 on node1 (pid [0-9]*) is stopped" <<<"$line" || fail "rank 2 does not say rank 3 is stopped"; }
  [[ $fault == partition* && $node == 1 ]] && { grep -q "the job's store has not answered this rank (on node1)" <<<"$line" || fail "rank $r does not say its host is cut off"; }
  grep -qE '\.(cpp|cc|hpp|h):[0-9]' <<<"$line" && fail "rank $r's error quotes source locations"
done
grep -l "frame #\|Exception raised from" "$logs"/node*.log && fail "C++ stack frames in the output"
echo "PASS: $fault: every surviving rank exited in time, naming the operation, the mesh dim and the lost peers"
