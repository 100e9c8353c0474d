#!/usr/bin/env bash
# Where a cold build's time goes, from ninja's log of a build that ./dev build --profile just ran (a fresh
# build tree, ccache off, the targets ./dev test builds): the whole build's wall time, each step's time
# (a unity batch, a precompiled header, a link, a script writing test data), grouped and the 20 longest.
# Writes bench/results/build_time.md (or build_time_per_file.md for a build without unity batches).
#   bench/build_time.sh <build-dir> <wall-seconds> unity|per-file
set -euo pipefail
BUILD=${1:?usage: bench/build_time.sh <build-dir> <wall-seconds> unity|per-file}
WALL=${2:?wall seconds}
MODE=${3:?unity or per-file}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/bench/record.sh"
case "$MODE" in
  unity) OUT=$ROOT/bench/results/build_time.md flag="" ;;
  per-file) OUT=$ROOT/bench/results/build_time_per_file.md flag=" --per-file" ;;
  *) echo "bench/build_time.sh: mode '$MODE' is neither unity nor per-file" >&2; exit 2 ;;
esac

# .ninja_log (v5): start_ms end_ms mtime output hash. A step with several outputs has a line per output with
# the same times and hash: counted once, under its first output.
steps=$(awk -F'\t' 'NR > 1 && !seen[$1 FS $2 FS $5]++ { printf "%.1f\t%s\n", ($2 - $1) / 1000, $4 }' "$BUILD/.ninja_log")
kind() {  # the kind of a step, from its output
  awk -F'\t' '{
    o = $2; k = "other"
    if (o ~ /cmake_pch\.hxx\.gch$/) k = "precompiled header"
    else if (o ~ /\.o$/ && o ~ /^CMakeFiles\/dtensor(_compiled)?\.dir\//) k = "library"
    else if (o ~ /\.o$/ && o ~ /^tests\//) k = "tests"
    else if (o ~ /\.o$/ && o ~ /^examples\//) k = "examples"
    else if (o ~ /\.o$/) k = "other objects"
    else if (o ~ /\.(so|a)$/ || o ~ /^(tests|examples)\/[^\/.]+$/) k = "link"
    else if (o ~ /\.(json|txt)$/ || o ~ /\/done$/) k = "test data (Python)"
    printf "%s\t%s\t%s\n", $1, k, o }'
}
total_cpu=$(awk -F'\t' '{ s += $1 } END { printf "%.0f", s }' <<<"$steps")

{
  echo "# Cold build time"
  echo
  echo "Command: \`./dev build --profile$flag\` (a fresh build tree in build-profile/ with ccache off, the targets"
  echo "\`./dev test\` builds, then \`bench/build_time.sh\` reads ninja's log)"
  echo
  bench_record "$BUILD"
  echo "- Unity batches: $([[ $MODE == unity ]] && echo "on (DTENSOR_UNITY_BATCH_SIZE $(sed -n 's/^DTENSOR_UNITY_BATCH_SIZE:STRING=//p' "$BUILD/CMakeCache.txt"))" || echo off); parallel jobs: ${DTENSOR_JOBS:-2}"
  echo
  echo "Configure and build: **${WALL} s** wall. The steps' times add up to ${total_cpu} s: as many seconds of"
  echo "one core, about, as the build keeps ${DTENSOR_JOBS:-2} busy."
  echo
  echo "| kind | steps | seconds | share |"
  echo "| --- | ---: | ---: | ---: |"
  kind <<<"$steps" | awk -F'\t' -v total="$total_cpu" '{ n[$2]++; s[$2] += $1 }
    END { for (k in s) printf "| %s | %d | %.0f | %.0f%% |\n", k, n[k], s[k], 100 * s[k] / total }' | sort -t'|' -k4 -rn
  echo
  echo "The 20 longest steps (a unity batch compiles the files its .cpp under build/unity/ lists):"
  echo
  echo "| seconds | kind | step |"
  echo "| ---: | --- | --- |"
  kind <<<"$steps" | sort -t$'\t' -k1 -rn | head -20 | awk -F'\t' '{ printf "| %s | %s | `%s` |\n", $1, $2, $3 }'
} | tee "$OUT"
echo "wrote $OUT" >&2
