#!/usr/bin/env bash
# The Hugging Face models' per-rank programs, compiled: the TP=4 forward of each family (training IR)
# and the Llama's joint forward+backward expanded on DP2 x TP2. The graph tests that make them save them
# (tests/dist/graph/hugging_face_test.cpp through expect_saves.h, with sample inputs and the
# interpreter's outputs); this runs just those two tests with their outputs sent to DIR/saved, then
# compiles the programs named below into DIR/compiled (scripts/compile_rank_programs.py, packages kept
# by content in ~/.cache/dtensor/compiled_programs, DTENSOR_COMPILED_CACHE, so that programs already
# compiled on this machine are copied, not compiled). NAMES (optional, one argument, space-separated)
# picks some of the programs; all of them by default. Prints the names, one line, last.
#   tests/compiled/hf_rank_programs.sh DTENSOR_DIST_TESTS PYTHON SOURCE_DIR DIR [NAMES]
# Used by ctest compiled_hf_programs and bench/graph.sh.
set -euo pipefail
tests=$1 python=$2 source=$3 dir=$4
read -r -a names <<< "${5:-hf_llama_train_ir hf_mistral_train_ir hf_qwen2_train_ir hf_mixtral_train_ir hf_gpt2_train_ir hf_llama_joint_dp2tp2}"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$HOME/.cache/dtensor/inductor}
mkdir -p "$dir"
DTENSOR_TIMEOUT_S=${DTENSOR_TIMEOUT_S:-120} DTENSOR_TEST_OUTPUTS="$dir/outputs" "$tests" \
  --gtest_filter='HuggingFaceTensorParallelTest.EveryFamilyWithItsPlanOnFourRanks:Layouts/HuggingFaceTraining.EveryFamilyTrainsLikeOneProcess/dp2tp2' >&2
mv "$dir/outputs/graph_saved" "$dir/saved"
rm -rf "$dir/outputs"
programs=()
for name in "${names[@]}"; do programs+=("$dir"/saved/tp_${name}_rank{0,1,2,3}.pt2); done
"$python" "$source/scripts/compile_rank_programs.py" --threads 1 --cache "${DTENSOR_COMPILED_CACHE:-$HOME/.cache/dtensor/compiled_programs}" \
  --out "$dir/compiled" "${programs[@]}" >&2
echo "${names[*]}"
