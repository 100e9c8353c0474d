# A cluster of "nodes" on one machine, for the multi-node tests: each node is a network namespace with
# its own address and host name, joined to the others by a veth pair on a bridge in a hub namespace.
# Source it, then call cluster_up N; everything it made (namespaces, links, processes) is removed on
# exit, and cluster_down fails the test if anything is left behind. Needs root (CI runs as root).
#
#   cluster_with_logs N      cluster_up N with a log directory $logs, and fail MESSAGE
#   on_node I CMD...         run CMD on node I (host name nodeI, address 10.77.0.<I+1>, interface eth0)
#   node_disk                the path of every node's own disk (each node sees its own directory there)
#   node_address I           that address
#   link_down I / link_up I  take node I's link off the bridge and back (a partition)
#   kill_node I              SIGKILL every process on node I (a lost machine)
#   ranks_exit_times PATTERN DEADLINE_S FILE [NODES]   record, per node (every node, or those listed),
#                            the seconds until no process whose name matches PATTERN runs there any
#                            more (or "never" past the deadline)

CLUSTER=dt$$
CLUSTER_NODES=0

node_namespace() { echo "${CLUSTER}n$1"; }
node_address() { echo "10.77.0.$(($1 + 1))"; }

# Namespaces of clusters whose script is gone (killed past its ctest timeout, which no trap survives):
# their processes killed and the namespaces removed. Prints what it removed.
cluster_sweep_stale() {
  local ns owner
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^dt[0-9]+(hub|n[0-9]+)$'); do
    owner=${ns#dt}
    owner=${owner%%[hn]*}
    kill -0 "$owner" 2>/dev/null && continue
    ip netns pids "$ns" | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" && echo "cluster: removed $ns, left behind by process $owner"
  done
}

cluster_up() {
  CLUSTER_NODES=$1
  cluster_sweep_stale
  trap 'cluster_down || exit 1' EXIT
  ip netns add "${CLUSTER}hub"
  ip -n "${CLUSTER}hub" link add br0 type bridge
  ip -n "${CLUSTER}hub" link set br0 up
  local i ns
  for ((i = 0; i < CLUSTER_NODES; i++)); do
    ns=$(node_namespace "$i")
    ip netns add "$ns"
    ip link add "v$i" netns "${CLUSTER}hub" type veth peer name eth0 netns "$ns"
    ip -n "${CLUSTER}hub" link set "v$i" master br0 up
    ip -n "$ns" addr add "$(node_address "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
  # Every node resolves every node's name (torchrun's elastic rendezvous looks its own up).
  CLUSTER_HOSTS=$(mktemp)
  { echo "127.0.0.1 localhost"; for ((i = 0; i < CLUSTER_NODES; i++)); do echo "$(node_address "$i") node$i"; done; } >"$CLUSTER_HOSTS"
  # Every node's own disk, seen by it alone at the same path (node-local checkpoints).
  CLUSTER_DISKS=$(mktemp -d)
  mkdir "$CLUSTER_DISKS/local"
  for ((i = 0; i < CLUSTER_NODES; i++)); do mkdir "$CLUSTER_DISKS/node$i"; done
  export GLOO_SOCKET_IFNAME=eth0 DTENSOR_CLUSTER=$CLUSTER CLUSTER_HOSTS CLUSTER_DISKS
}

node_disk() { echo "$CLUSTER_DISKS/local"; }

# Its own UTS namespace gives each node its own host name, which errors name and MPI and node-local
# checkpoints tell nodes apart by; its own mount namespace, an /etc/hosts naming every node and its own
# disk (enter_node).
on_node() {
  local i=$1
  shift
  ip netns exec "$(node_namespace "$i")" unshare --uts --mount "$(dirname "${BASH_SOURCE[0]}")/enter_node" "node$i" "$@"
}

# A test's cluster of N nodes with a log directory LOGS, removed with it on exit, and fail MESSAGE,
# which prints the message and every *.log there and ends the test: cluster_with_logs N
cluster_with_logs() {
  cluster_up "$1"
  logs=$(mktemp -d)
  trap 'rm -rf "$logs"; cluster_down || exit 1' EXIT
}
fail() {
  echo "FAIL: $*"
  local f
  for f in "$logs"/*.log; do echo "== $(basename "$f" .log)"; cat "$f"; done
  exit 1
}

link_down() { ip -n "${CLUSTER}hub" link set "v$1" down; }
link_up() { ip -n "${CLUSTER}hub" link set "v$1" up; }

node_processes() { ip netns pids "$(node_namespace "$1")" 2>/dev/null; }

kill_node() { node_processes "$1" | xargs -r kill -9 2>/dev/null || true; }

ranks_exit_times() {
  local pattern=$1 deadline=$2 out=$3 nodes=${4:-$(seq -s ' ' 0 $((CLUSTER_NODES - 1)))} start i t
  start=$(date +%s.%N)
  local -a left
  for ((i = 0; i < CLUSTER_NODES; i++)); do left[i]=0; done
  for i in $nodes; do left[i]=1; done
  : >"$out"
  while :; do
    t=$(echo "$(date +%s.%N) - $start" | bc)
    local running=0
    for ((i = 0; i < CLUSTER_NODES; i++)); do
      ((left[i])) || continue
      if node_processes "$i" | xargs -r ps -o comm= -p 2>/dev/null | grep -q -- "$pattern"; then
        running=1
      else
        left[i]=0
        printf 'node%d %.1f\n' "$i" "$t" >>"$out"
      fi
    done
    ((running)) || break
    if (($(echo "$t > $deadline" | bc))); then
      for ((i = 0; i < CLUSTER_NODES; i++)); do ((left[i])) && echo "node$i never" >>"$out"; done
      break
    fi
    sleep 0.2
  done
}

cluster_down() {
  local i ns status=0
  for ((i = 0; i < CLUSTER_NODES; i++)); do kill_node "$i"; done
  for ((i = 0; i < CLUSTER_NODES; i++)); do
    ns=$(node_namespace "$i")
    # A killed process leaves the namespace only once the kernel has torn it down, which on a loaded
    # machine can take well over the 0.2 s that once sufficed: wait up to 5 s, killing again.
    local tries=25
    while [[ -n "$(node_processes "$i")" ]] && ((tries-- > 0)); do sleep 0.2; kill_node "$i"; done
    if [[ -n "$(node_processes "$i")" ]]; then
      echo "cluster: processes left on node$i:"
      node_processes "$i" | xargs -r ps -o pid=,stat=,comm= -p
      status=1
    fi
    ip netns del "$ns" 2>/dev/null
  done
  ip netns del "${CLUSTER}hub" 2>/dev/null
  rm -f "$CLUSTER_HOSTS"
  rm -rf "$CLUSTER_DISKS"
  CLUSTER_NODES=0
  if ip netns list | grep -q "^${CLUSTER}"; then echo "cluster: namespaces left behind"; status=1; fi
  if ip -o link | grep -q "${CLUSTER}"; then echo "cluster: links left behind"; status=1; fi
  trap - EXIT
  return $status
}

# RANKS_PER_NODE is one count for every node ("2") or one per node ("2,1,1").
ranks_on_node() {
  local -a counts
  IFS=, read -r -a counts <<<"$1"
  echo "${counts[$2]:-${counts[0]}}"
}

# torchrun on every node, or on the nodes RUN_NODES lists ("0 1"), the store on the first of them, in
# the background, each node's output in LOG_PREFIX<I>.log:
#   [RUN_NODES="..."] start_torchrun PYTHON RANKS_PER_NODE LOG_PREFIX PROGRAM ARGS...
start_torchrun() {
  local python=$1 per_node=$2 log=$3 i k=0
  shift 3
  local -a nodes
  read -r -a nodes <<<"${RUN_NODES:-$(seq -s ' ' 0 $((CLUSTER_NODES - 1)))}"
  local port=$((20000 + $$ % 20000 + ${#nodes[@]}))
  for i in "${nodes[@]}"; do
    # (the & runs the whole command in a subshell: count outside it)
    local node_rank=$((k++))
    on_node "$i" "$python" -m torch.distributed.run --nnodes "${#nodes[@]}" --node-rank "$node_rank" \
      --nproc-per-node "$(ranks_on_node "$per_node" "$i")" --master-addr "$(node_address "${nodes[0]}")" --master-port "$port" \
      --no-python "$@" >"$log$i.log" 2>&1 &
  done
}

# mpirun from node 0 over every node (RANKS_PER_NODE ranks each), started on the others by netns_agent,
# the world's store on node 0 (where rank 0 runs; MASTER_ADDR set empty: none): run_mpirun RANKS_PER_NODE
# PROGRAM ARGS...
run_mpirun() {
  local per_node=$1 hosts="" i n total=0
  shift
  for ((i = 0; i < CLUSTER_NODES; i++)); do
    n=$(ranks_on_node "$per_node" "$i")
    hosts+="${hosts:+,}$(node_address "$i"):$n"
    total=$((total + n))
  done
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MASTER_ADDR=${MASTER_ADDR-$(node_address 0)} \
    MASTER_PORT=$((20000 + $$ % 20000)) on_node 0 mpirun -H "$hosts" -np "$total" \
    --mca plm_rsh_agent "$(dirname "${BASH_SOURCE[0]}")/netns_agent" --mca btl_tcp_if_include eth0 \
    --mca oob_tcp_if_include eth0 -x DTENSOR_CLUSTER -x MASTER_ADDR -x MASTER_PORT -x DTENSOR_TIMEOUT_S "$@"
}
