#!/usr/bin/env bash
# The Hugging Face models' compiled per-rank programs run equal to dtensor's interpreter (ctest
# compiled_hf_programs): tests/compiled/hf_rank_programs.sh saves and compiles them, the job runs each
# rank's package and the program read back on the saved sample inputs against the interpreter's outputs.
# The suite compiles the Llama's (TP=4 forward, DP2 x TP2 joint step: 8 packages); `./dev bench graph`
# compiles and checks every family's.
#   tests/compiled/compiled_hf_programs.sh JOB DTENSOR_DIST_TESTS PYTHON SOURCE_DIR
set -euo pipefail
job=$1 tests=$2 python=$3 source=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
names=$("$source/tests/compiled/hf_rank_programs.sh" "$tests" "$python" "$source" "$dir" "hf_llama_train_ir hf_llama_joint_dp2tp2")
# shellcheck disable=SC2086  # the names, one word each
"$job" saved "$dir" $names
