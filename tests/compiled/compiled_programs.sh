#!/usr/bin/env bash
# Compiled per-rank programs on 4 ranks, from saving to refusing bad packages (ctest compiled_programs):
# the job saves each rank's TP=4 programs of the exported MLP (forward, and joint forward+backward) with
# sample inputs, the venv's Python compiles them with AOTInductor (scripts/compile_rank_programs.py), a
# copy of each forward package is made as if compiled on another machine, and the job runs and trains
# them against the single-process program.
#   tests/compiled/compiled_programs.sh JOB PYTHON SOURCE_DIR
#
# Compiling the 8 programs is most of the test's time (about a minute on 2 cores) and depends only on the
# saved programs' bytes (save_program writes the same bytes for the same program), the compile script,
# the venv's torch and this machine's CPU flags. The packages are kept under a key of those in
# ~/.cache/dtensor/compiled_programs (DTENSOR_COMPILED_CACHE), the last few keys only, so that a run
# whose programs did not change (the same build run again, or a fresh clone of the same code) reuses
# them. Any change to what dtensor saves changes the key and compiles afresh.
set -euo pipefail
job=$1 python=$2 source=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$HOME/.cache/dtensor/inductor}
cache=${DTENSOR_COMPILED_CACHE:-$HOME/.cache/dtensor/compiled_programs}
"$job" save "$dir"
programs=("$dir"/programs/{mlp,joint}_rank{0,1,2,3}.pt2)
key=$({
  sha256sum "${programs[@]}" "$source/scripts/compile_rank_programs.py" | cut -d' ' -f1
  "$python" -c 'import importlib.metadata as m; print(m.version("torch"))'
  grep -m1 '^flags' /proc/cpuinfo
} | sha256sum | cut -c1-32)
if [[ -d "$cache/$key" ]]; then
  echo "compiled packages of these programs from $cache/$key (compiled by an earlier run)"
  touch "$cache/$key"
else
  "$python" "$source/scripts/compile_rank_programs.py" --threads 1 --out "$dir/compiled" "${programs[@]}"
  mkdir -p "$cache"
  staging=$(mktemp -d "$cache/.staging.XXXXXX")
  cp "$dir"/compiled/*.pt2 "$staging/"
  mv -T "$staging" "$cache/$key" 2>/dev/null || rm -rf "$staging"  # another run stored the same key first
  # Keep the 4 most recently used keys.
  ls -1dt "$cache"/*/ | tail -n +5 | xargs -r rm -rf
fi
mkdir -p "$dir/compiled"
cp "$cache/$key"/*.pt2 "$dir/compiled/"
for r in 0 1 2 3; do
  "$python" "$source/tests/compiled/as_if_compiled_elsewhere.py" "$dir/compiled/mlp_rank$r.pt2" "$dir/other_machine/mlp_rank$r.pt2"
done
"$job" run "$dir"
