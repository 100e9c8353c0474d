#!/usr/bin/env bash
# SPMD expansion of the 32-layer Llama joint program on DP2 x TP2, this tree against an older one, in one
# run on this machine: both builds' dtensor_expansion_bench alternate (which goes first alternating by
# round) on the same exported model, with each one's default search and with the local search. Prints a
# Markdown table (medians over rounds) to append to bench/results/expansion.md.
#   bench/expansion_against.sh <build-dir> <base-build-dir> <base-commit> [--rounds R]
# The base build needs only its bench target: cmake --build <base-build-dir> --target dtensor_expansion_bench.
set -euo pipefail
BUILD=${1:?usage: bench/expansion_against.sh <build-dir> <base-build-dir> <base-commit> [--rounds R]}
BASE_BUILD=${2:?base build dir}
BASE_COMMIT=${3:?base commit}
ROUNDS=3
[[ ${4:-} == --rounds ]] && ROUNDS=${5:?}
MODELS=$BUILD/bench_models/llama_depths
[[ -f $MODELS/llama_L32_joint.pt2 ]] || { echo "run ./dev bench expansion first (it exports the models)" >&2; exit 2; }
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
run() {  # side search: one line "side|search|seconds|method|cost"
  local bench=$BUILD/bench/dtensor_expansion_bench
  [[ $1 == base ]] && bench=$BASE_BUILD/bench/dtensor_expansion_bench
  local args=(--model "$MODELS/llama_L32_joint.pt2" --plan "$MODELS/llama_tp_plan.json")
  [[ $2 != default ]] && args+=(--search "$2")
  "$bench" "${args[@]}" | tail -1 |
    sed -E "s#^.*expanded in ([0-9.]+) s \(([^,]+(\([^)]*\))?), modelled ([0-9.]+) kB.*\$#$1|$2|\1|\2|\4#" >> "$raw"
}
for ((r = 0; r < ROUNDS; ++r)); do
  order="base head"
  ((r % 2)) && order="head base"
  for search in default local; do
    for side in $order; do run "$side" "$search"; done
  done
done
echo "| tree | search | method | seconds (median of $ROUNDS) | modelled cost |"
echo "| --- | --- | --- | --- | --- |"
head_commit=$(git -C "$(dirname "$0")" rev-parse --short HEAD)
for side in base head; do
  for search in default local; do
    rows=$(grep "^$side|$search|" "$raw")
    seconds=$(cut -d'|' -f3 <<<"$rows" | sort -n | awk '{t[NR] = $1} END {print NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2}')
    method=$(tail -1 <<<"$rows" | cut -d'|' -f4)
    cost=$(tail -1 <<<"$rows" | cut -d'|' -f5)
    commit=$BASE_COMMIT
    [[ $side == head ]] && commit=$head_commit
    echo "| $side ($commit) | $search | $method | $seconds | $cost kB |"
  done
done
