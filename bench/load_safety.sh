#!/usr/bin/env bash
# The price of validating untrusted files: load_safety_bench built against this tree and against BASE
# (the commit before the readers were hardened, default 83e783e), run alternately in one run on this
# machine; writes bench/results/load_safety.md.
#   bench/load_safety.sh <build-dir> [--base COMMIT] [--blocks K] [--rounds R] [--mb M]   (./dev bench load_safety)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/load_safety.sh <build-dir> [--base COMMIT] [--blocks K] [--rounds R] [--mb M]}
shift
FLAGS="$*"
BASE=83e783e BLOCKS=3 ROUNDS=20 MB=1024
while [[ $# -gt 0 ]]; do
  case $1 in
    --base) BASE=$2 ;; --blocks) BLOCKS=$2 ;; --rounds) ROUNDS=$2 ;; --mb) MB=$2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
  shift 2
done
WORK=$BUILD/load-safety
TORCH_DIR=$(sed -n 's/^DTENSOR_TORCH_DIR:PATH=//p' "$BUILD/CMakeCache.txt")
TORCH_ABI=$(sed -n 's/^DTENSOR_TORCH_CXX11_ABI:STRING=//p' "$BUILD/CMakeCache.txt")

# Both trees, built the same way (ccache keeps the second and later builds short).
base_tree=$WORK/base-src
if [[ "$(git -C "$base_tree" rev-parse HEAD 2>/dev/null)" != "$(git -C "$ROOT" rev-parse "$BASE")" ]]; then
  rm -rf "$base_tree"
  git -C "$ROOT" worktree prune
  git -C "$ROOT" worktree add --detach "$base_tree" "$BASE" >&2
fi
for side in base head; do
  tree=$ROOT
  [[ $side == base ]] && tree=$base_tree
  if [[ ! -f "$WORK/$side/build.ninja" ]]; then
    CCACHE_BASEDIR=$tree cmake -S "$ROOT/bench/load_safety" -B "$WORK/$side" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DDTENSOR_TREE="$tree" -DDTENSOR_TORCH_DIR="$TORCH_DIR" \
      -DDTENSOR_TORCH_CXX11_ABI="$TORCH_ABI" >&2
  fi
  CCACHE_BASEDIR=$tree cmake --build "$WORK/$side" -j "${DTENSOR_JOBS:-2}" --target load_safety_bench >&2
done

# The 32-layer Llama of the expansion bench (bench/expansion.sh), exported here when that bench has
# not left it in this build.
PYTHON=$(sed -n 's/^DTENSOR_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
llama=$BUILD/bench_models/llama_depths/llama_L32_joint.pt2
[[ -f $llama ]] || "$PYTHON" "$ROOT/scripts/export_llama_depths.py" "$(dirname "$llama")" 32 >&2
LLAMA_ROUNDS=$(((ROUNDS + 3) / 4))  # a load of it takes a quarter of a second or more

# Blocks alternate which side goes first; every figure is a median over rounds, and the table gives
# the median over blocks.
pt2=$BUILD/graph_models/gpt_train_ir_static.pt2
raw=$WORK/raw.txt
: > "$raw"
for ((k = 0; k < BLOCKS; ++k)); do
  order="base head"
  ((k % 2)) && order="head base"
  for side in $order; do
    "$WORK/$side/load_safety_bench" pt2 "$pt2" --rounds "$((ROUNDS * 5))" | sed "s/^/$side /" >> "$raw"
    "$WORK/$side/load_safety_bench" pt2 "$llama" --rounds "$LLAMA_ROUNDS" | sed "s/^pt2_/llama32_/; s/^/$side /" >> "$raw"
    "$WORK/$side/load_safety_bench" checkpoint "${TMPDIR:-/tmp}/dtensor-load-safety" --mb "$MB" --rounds "$ROUNDS" \
      | grep -E '^(checkpoint_)' | sed "s/^/$side /" >> "$raw"
  done
done

RESULTS=$ROOT/bench/results/load_safety.md
{
  cat <<EOT
# The price of safety: loading with the hardened readers against before

Command: \`./dev bench load_safety${FLAGS:+ $FLAGS}\` (runs \`bench/load_safety.sh\`: \`load_safety_bench\` built against this tree,
the commit below, and against $(git -C "$ROOT" rev-parse --short "$BASE"), the tree before the readers were hardened,
with the same flags; the two alternate, $BLOCKS blocks, which side goes first alternating by block).

$(bench_record "$WORK/head")
- Both sides are built alike: the same build type, compiler, flags and LibTorch

Measured: \`graph::load_program\` of the suite's GPT (\`gpt_train_ir_static.pt2\`, 1.7 MiB), alone and followed by
reading every weight (which now checks each record's CRC-32), medians of $((ROUNDS * 5)) rounds per block; the same
for the 32-layer Llama joint graph of the expansion bench (\`llama_L32_joint.pt2\`, $(du -m "$llama" | cut -f1) MiB),
medians of $LLAMA_ROUNDS rounds per block; a
$MB MiB checkpoint saved Shard(0) over 4 local ranks and loaded into Shard(1) (every rank reads rows of
every file; the mean over ranks from a shared start to the last rank's end), and \`checkpoint::contents\`
of it on rank 0 (the headers alone), medians of $ROUNDS rounds per block. Goal: head / base <= 1.05.

| measurement | base (before) | head (hardened) | head / base |
| --- | --- | --- | --- |
EOT
  for m in pt2_load pt2_load_and_read_weights llama32_load llama32_load_and_read_weights checkpoint_load_other_layout checkpoint_contents; do
    b=$(awk -v m=$m '$1=="base" && $2==m {print $3}' "$raw" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
    h=$(awk -v m=$m '$1=="head" && $2==m {print $3}' "$raw" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
    awk -v m=$m -v b="$b" -v h="$h" 'BEGIN {printf "| %s | %.2f ms | %.2f ms | %.3f |\n", m, b * 1000, h * 1000, h / b}'
  done
  echo
  echo "Every block's medians (seconds):"
  echo
  echo '```'
  cat "$raw"
  echo '```'
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
