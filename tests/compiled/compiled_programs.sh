#!/usr/bin/env bash
# Compiled per-rank programs on 4 ranks, from saving to refusing bad packages (ctest compiled_programs):
# the job saves each rank's TP=4 programs of the exported MLP (forward, and joint forward+backward) with
# sample inputs, the venv's Python compiles them with AOTInductor (scripts/compile_rank_programs.py), a
# copy of each forward package is made as if compiled on another machine, and the job runs and trains
# them against the single-process program.
#   tests/compiled/compiled_programs.sh JOB PYTHON SOURCE_DIR
#
# Compiling the 8 programs is most of the test's time (about a minute on 2 cores); the compile script keeps
# each package under a key of what it depends on (the program's bytes, which save_program writes alike for
# the same program, the script, torch, the thread count, the CPU flags) in ~/.cache/dtensor/compiled_programs
# (DTENSOR_COMPILED_CACHE), so that a run whose programs did not change (the same build run again, or a
# fresh clone of the same code) reuses them. Any change to what dtensor saves compiles afresh.
set -euo pipefail
job=$1 python=$2 source=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$HOME/.cache/dtensor/inductor}
"$job" save "$dir"
programs=("$dir"/programs/{mlp,joint}_rank{0,1,2,3}.pt2)
"$python" "$source/scripts/compile_rank_programs.py" --threads 1 --cache "${DTENSOR_COMPILED_CACHE:-$HOME/.cache/dtensor/compiled_programs}" \
  --out "$dir/compiled" "${programs[@]}"
for r in 0 1 2 3; do
  "$python" "$source/tests/compiled/as_if_compiled_elsewhere.py" "$dir/compiled/mlp_rank$r.pt2" "$dir/other_machine/mlp_rank$r.pt2"
done
"$job" run "$dir"
