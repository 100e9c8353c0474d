#pragma once
// What each module of an exported program is, for a tensor-parallel plan: read from how the graph uses
// its weight, so that joint forward+backward graphs (which carry no nn_module_stack) are read right,
// and checked against the class nn_module_stack names where the graph has it. A GPT-2 Conv1D holds its
// weight [in, out] and multiplies by it directly; a Linear holds [out, in] and multiplies by its
// transpose: sharding one as the other would shard the wrong dim.

#include <map>
#include <optional>
#include <string>

#include "dtensor/graph/program.h"

namespace dtensor::graph::detail {

// ExpertsLinear and ExpertsConv1D: a mixture of experts' 3-d weight [expert, out, in] (or [expert, in,
// out]), each token-expert pair selecting its expert's matrix by index before a batched multiply
// (transformers' "batched_mm" experts). Transformers' plans name such a weight itself
// ("layers.*.mlp.experts.gate_up_proj"), so it is listed under its own path.
enum class ModuleKind { Linear, Conv1D, Embedding, ExpertsLinear, ExpertsConv1D, Other };
std::string to_string(ModuleKind kind);

// The dims of a layer's weight that hold its output and its input features (Embedding: vocabulary,
// embedding dim). Throws for Other.
struct FeatureDims {
  int64_t out, in;
};
FeatureDims feature_dims(ModuleKind kind);

struct ModuleInfo {
  std::string type;  // the class nn_module_stack names ("transformers.pytorch_utils.Conv1D"), or ""
  ModuleKind kind = ModuleKind::Other;  // from the use of its weight (Other: no weight, or another use)
  // Its parameter "<path>.weight", if it has one, as the graph reads it: a weight tied to another
  // module's (GPT-2's lm_head and wte) is one graph input, saved under one of the two names.
  Value* weight = nullptr;
  std::string weight_name;  // the state name of that input
  std::string bias_name;    // where its bias would be: "<path>.bias", or an expert weight's "<path>_bias"
  // A projection into heads: the count its output features are split into by the first view that
  // splits them ([.., n * d] -> [.., n, d]); nullopt when no view does.
  std::optional<int64_t> heads;
};

// Every module of `program` by path: those nn_module_stack names and the owners of its parameters.
// Throws DTensorError where the use of a weight contradicts the module's class (a Linear used as a
// Conv1D, say), naming both; a tied weight is used as one of its modules is, so it is not checked.
std::map<std::string, ModuleInfo> program_modules(const Program& program);

}  // namespace dtensor::graph::detail
