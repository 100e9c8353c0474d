#!/usr/bin/env bash
# SPMD expansion time against model depth: exports a Hugging Face Llama's joint graph at 2, 8 and 32
# layers (scripts/export_llama_depths.py, the project venv's torch and transformers) and times
# dtensor_expansion_bench on each, for each search; writes bench/results/expansion.md.
#   bench/expansion.sh <build-dir>      (what `./dev bench expansion` calls)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/record.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:?usage: bench/expansion.sh <build-dir>}
PYTHON=$(sed -n 's/^DTENSOR_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
MODELS=$BUILD/bench_models/llama_depths
DEPTHS=(2 8 32)
"$PYTHON" "$ROOT/scripts/export_llama_depths.py" "$MODELS" "${DEPTHS[@]}" >&2
RESULTS=$ROOT/bench/results/expansion.md
{
  cat <<EOT
# SPMD expansion time against depth (CPU)

Command: \`./dev bench expansion\` (runs \`bench/expansion.sh\`: \`scripts/export_llama_depths.py\`, then
\`dtensor_expansion_bench --model <build>/bench_models/llama_depths/llama_L<N>_joint.pt2 --plan .../llama_tp_plan.json --search S\`)

$(bench_record "$BUILD")

Method: the Hugging Face Llama of the test suite (hidden 32, 4 heads over 2 KV heads, vocabulary 62,
random init) at N layers, its joint forward+backward graph with transformers' causal-LM loss (batch
4, sequence 16), expanded by \`spmd_expand\` on DP2 x TP2 over 4 local ranks (the batch Shard(0) on dp,
the model's own plan on tp). Time: \`spmd_expand\` alone (loading excluded), the slowest rank; the 4
ranks share this machine's cores. Goal (issue 30): 32 layers in at most 10 s.

Where the time went, and what changed (commit 184cde7 took 1.83 / 3.13 s at 2 layers, 6.75 / 8.98 s
at 8 and 28.1 / 31.8 s at 32, local search / exact; the same modelled costs as below):
- Asking the sharding rules for every node's strategies was 60%. A model repeats its layers, so the
  answers are now shared by every node asking the same question (src/graph/strategy_key.h: the
  operator, its arguments, its inputs' metadata and placements).
- The local search read a value's consumer targets once per target (quadratic for a value read by
  dozens of nodes) out of std::maps; it now reads each target once, from flat per-value storage.
- The exact search spelled every live value into each state's key (thousands in a joint graph, whose
  activations live until backward) for 20,000 states before giving up; its budget now counts the
  values spelled as well, so it gives up as soon as the graph is out of its reach.

Searches: \`local\` (from three starts), \`exact\` (after the local search, within a budget of states),
\`auto\` (the default since issue 49: the exact search only for problems of at most 32 nodes with
options, so on these graphs the local search alone). The method column says what ran.

| layers | nodes | search | method | seconds | modelled cost (chosen / node by node) | collectives |
| --- | --- | --- | --- | --- | --- | --- |
EOT
  for n in "${DEPTHS[@]}"; do
    for search in local exact auto; do
      line=$("$BUILD/bench/dtensor_expansion_bench" --model "$MODELS/llama_L${n}_joint.pt2" --plan "$MODELS/llama_tp_plan.json" \
               --search "$search" | tail -1)
      # "<path>: N nodes, expanded in S s (METHOD, modelled A kB vs node by node B kB); collectives: ..."
      echo "$line" | sed -E "s#^.*: ([0-9]+) nodes, expanded in ([0-9.]+) s \(([^,]+(\([^)]*\))?), modelled ([0-9.]+) kB vs node by node ([0-9.]+) kB\); collectives: (.*)\$#| $n | \1 | $search | \3 | \2 | \5 kB / \6 kB | \7 |#"
    done
  done
} > "$RESULTS.tmp"
mv "$RESULTS.tmp" "$RESULTS"
cat "$RESULTS"
