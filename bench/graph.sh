#!/usr/bin/env bash
# Runs the graph benchmarks (forward: graph TP; training step: SPMD expansion of the joint program;
# each also compiled with AOTInductor) for TP = 2, 4, the Hugging Face models' per-rank programs compiled
# against the interpreter, then the expansion-time bench, and writes bench/results/graph.md.
#   bench/graph.sh <build-dir> [--rounds R]      (what `./dev bench graph` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/graph.sh <build-dir> [--rounds R]}
shift
RESULTS=$ROOT/bench/results/graph.md
PYTHON=$(grep '^DTENSOR_PYTHON:' "$BUILD/CMakeCache.txt" | cut -d= -f2)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$HOME/.cache/dtensor/inductor}
CACHE_STATE=$([[ -d $TORCHINDUCTOR_CACHE_DIR ]] && echo "as left by earlier runs" || echo cold)
MODEL=$BUILD/graph_models/gpt_train_ir_static.pt2
JOINT=$BUILD/graph_models/gpt_joint.pt2
# One table with the compiled contender: the bench saves each rank's program with its sample inputs, the
# venv's Python compiles them, and the bench times the packages next to the others.
#   compiled_run NAME TP BENCH_ARGS...
compiled_run() {
  local tp=$2 dir=$WORK/$1_tp$2
  shift 2
  "$BUILD/bench/dtensor_graph_bench" --tp "$tp" --save-programs "$dir/programs" "$@" >&2
  local start=$(date +%s%N)
  "$PYTHON" "$ROOT/scripts/compile_rank_programs.py" --threads 1 --out "$dir/compiled" "$dir"/programs/rank*.pt2 >&2
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  "$BUILD/bench/dtensor_graph_bench" --tp "$tp" --compiled "$dir/compiled" "$@"
  echo
  printf 'Compiling the %d rank programs (AOTInductor, one after another, Inductor cache %s): %d.%d s\n\n' \
    "$tp" "$CACHE_STATE" $((ms / 1000)) $((ms % 1000 / 100))
  CACHE_STATE=warm
}

# The Hugging Face models' programs as the graph tests save them (tests/compiled/hf_rank_programs.sh: the
# two tests run from dtensor_dist_tests, built here if this build lacks it), compiled, and timed against the
# interpreter on the same per-rank programs.
hugging_face_section() {
  echo "## Hugging Face models: compiled against the interpreter"
  echo
  cat <<'EOT'
The suite's Hugging Face causal LMs (`scripts/export_hf_models.py`: 2 layers, hidden 32 (Mistral's 64),
vocab 62, sequence 16, batch 2, the joint program's batch 4): each family's TP=4 forward program
(training IR, the family's own plan, GPT-2 Megatron's) and the Llama's joint forward+backward expanded on
DP2 x TP2 (loss and gradients; no optimizer step), the per-rank programs that
`tests/dist/graph/hugging_face_test.cpp` makes and saves with their sample inputs
(`tests/compiled/hf_rank_programs.sh`). *interpreter*: `graph::run` on the program read back from the
saved .pt2; *compiled*: its AOTInductor package (`scripts/compile_rank_programs.py --threads 1`) run by
`graph::CompiledProgram`. Both are first checked against the interpreter's outputs at saving (rtol 1e-4,
atol 1e-5). No hand-written baseline exists for these models: goal, compiled <= 0.9x the interpreter.
Timed as above (rounds of 5 runs, order rotating, a barrier before each, the slowest rank's time,
medians), 4 ranks, one intra-op thread each.

EOT
  cmake --build "$BUILD" --target dtensor_dist_tests >&2
  local dir=$WORK/hf start=$(date +%s%N) names
  if ! names=$("$ROOT/tests/compiled/hf_rank_programs.sh" "$BUILD/tests/dtensor_dist_tests" "$PYTHON" "$ROOT" "$dir" 2>"$WORK/hf.log"); then
    cat "$WORK/hf.log" >&2
    return 1
  fi
  cat "$WORK/hf.log" >&2
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  local reused=$(grep -c 'compiled by an earlier run' "$WORK/hf.log" || true)
  "$BUILD/bench/dtensor_graph_bench" --saved "$dir" --names "${names// /,}" "$@"
  echo
  printf 'Saving the programs (the two graph tests) and compiling the %d rank programs (one per CPU at a time; %d of them copied from the package cache): %d.%d s\n\n' \
    $(( $(wc -w <<<"$names") * 4 )) "$reused" $((ms / 1000)) $((ms % 1000 / 100))
}

# The expansion-time table: bench/expansion.sh (./dev bench expansion) runs, and its table is repeated.
expansion_section() {
  echo "## SPMD expansion time against depth"
  echo
  echo "Run by this script through \`bench/expansion.sh\` (\`./dev bench expansion\`), which also writes"
  echo "bench/results/expansion.md with its method: a Hugging Face Llama's joint graph at N layers, expanded on"
  echo "DP2 x TP2 by \`spmd_expand\`, the slowest of 4 ranks. Goal: 32 layers in at most 10 s."
  echo
  "$ROOT/bench/expansion.sh" "$BUILD" >/dev/null
  sed -n '/^| layers/,$p' "$ROOT/bench/results/expansion.md"
}

{
  cat <<EOT
# GPT under tensor parallelism from exported graphs vs eager module-level TP vs hand-written Megatron (CPU)

Command: \`./dev bench graph${*:+ $*}\` (runs \`bench/graph.sh\`, which runs \`dtensor_graph_bench --model <build>/graph_models/$(basename "$MODEL") --tp N${*:+ $*}\`
and \`dtensor_graph_bench --train --model <build>/graph_models/$(basename "$JOINT") --tp N${*:+ $*}\` for N = 2, 4)

$(bench_record "$BUILD")

Method: the GPT demo model (vocab 42, seq 32, dim 128, 8 heads, 2 layers, ffn 512, batch 8) exported
from Python with torch.export (training IR; \`scripts/export_test_models.py\`), one intra-op thread
per rank, over the launcher's default backend (the MPI backend through mpirun when dtensor has it;
Gloo over loopback with \`DTENSOR_BACKEND=gloo\`). All three compute the whole logits on every rank from the exported
weights and are checked equal to the single-process program before timing. *graph TP*: the program
transformed by \`dtensor::graph::tensor_parallel_transform\` with the demo's TP plan (LM head column-
parallel, its classes gathered at the end), run by the graph interpreter. *eager module-level TP*:
\`gpt::parallelize\` and \`model->logits\`, then \`full_tensor\`. *hand-written Megatron*: per-rank shards
and raw c10d all-reduces, logits all-gathered. Rounds of 5 forwards each, order rotating, a barrier
before every forward; a forward's time is the maximum over ranks; medians. *compiled graph TP*: the
same per-rank programs saved with their sample input (\`graph::save_program\`), compiled ahead of time
by AOTInductor (\`scripts/compile_rank_programs.py --threads 1\`, the venv's torch) and run from C++ by
\`graph::CompiledProgram\`, its collectives on the mesh's process groups. Goals: graph TP <= 1.0x and
compiled graph TP <= 0.9x the hand-written forward.

Training step: the same model's loss (mean cross-entropy), gradients and an AdamW step (lr 1e-3) on
a fixed batch. *graph SPMD*: the joint forward+backward program (\`torch.export.experimental.
_export_forward_backward\`, core ATen) expanded by \`dtensor::graph::spmd_expand\` from the plan's
parameter placements, one \`joint_step\` (the program: loss, gradients and their collectives) and
\`AdamW::step\` on the local shards. *eager module-level TP*: \`gpt::parallelize\`, forward, backward,
AdamW. *hand-written Megatron*: \`megatron::MegatronGpt\` (f/g autograd functions over raw c10d,
vocabulary-parallel cross-entropy), backward, AdamW. First losses checked against the single-process
program (rel 1e-4). *compiled graph SPMD*: the expanded joint program compiled likewise, the package
computing with parameters of its own that an AdamW steps in place (\`CompiledProgram::use_state_of\`,
gradients handed out by \`graph::take_joint_outputs\`). Same timing method. Goals: graph SPMD <= 1.0x and
compiled graph SPMD <= 0.9x hand-written. Also the expanded step's
peak of live activation bytes per rank with and without freeing each value after its last use.

EOT
  for tp in 2 4; do
    echo "## Forward, TP=$tp"
    echo
    compiled_run forward "$tp" --model "$MODEL" "$@"
  done
  for tp in 2 4; do
    echo "## Training step, TP=$tp"
    echo
    compiled_run train "$tp" --train --model "$JOINT" "$@"
  done
  hugging_face_section "$@"
  expansion_section
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
