#include "dtensor/graph/hugging_face.h"


#include <map>
#include <optional>

#include "../io/json.h"
#include "dtensor/errors.h"

namespace dtensor::graph {
namespace {

using json = nlohmann::ordered_json;  // entries apply in the file's order

// The graph meaning of each style transformers 5.24 registers (transformers/distributed/
// tensor_parallel.py and expert_parallel.py); nullopt: no entry (the parameters stay Replicate).
const std::map<std::string, std::optional<ParallelStyle>>& mapped_styles() {
  static const std::map<std::string, std::optional<ParallelStyle>> styles = {
      {"colwise", ColwiseParallel{}},
      {"colwise_rep", ColwiseParallel{.output_layout = Replicate()}},
      {"colwise_gather_output", ColwiseParallel{.output_layout = Replicate()}},
      {"rowwise", RowwiseParallel{}},
      {"rowwise_rep", RowwiseParallel{.input_layout = Replicate()}},
      {"rowwise_split_input", RowwiseParallel{.input_layout = Replicate()}},
      {"embedding_rowwise", RowwiseParallel{}},
      {"embedding_colwise", ColwiseParallel{}},
      {"packed_colwise", ColwiseParallel{.packed = 2}},
      {"replicate", std::nullopt},
      {"replicated_with_grad_allreduce", std::nullopt},
      {"all_reduce", std::nullopt},
      {"sequence_parallel", SequenceParallel{.use_local_output = true}},
      // Each rank runs its shard of every expert, and sums the experts' partial outputs: in a graph the
      // row-parallel down projection leaves them Partial, and sharding propagation reduces them where
      // they are read, so the module itself needs no entry.
      {"moe_tp_experts", std::nullopt},
      {"ep_dispatch_experts", ExpertParallel{}},
      // The experts' 3-d weights, Shard(0) over the ep dim: what the experts module's
      // ep_dispatch_experts entry does to them, so they need no entry of their own.
      {"grouped_gemm", std::nullopt},
  };
  return styles;
}

// Styles transformers has that graphs cannot apply yet, and why.
const std::map<std::string, std::string>& refused_styles() {
  static const std::map<std::string, std::string> styles = {
      {"packed_rowwise", "a row-parallel layer over packed input features"},
      {"local_params", "parameters kept as local tensors"},
      {"mla_kv_a_proj", "multi-head latent attention's KV down-projection"},
      {"moe_identity_expert", "an identity expert of a mixture of experts"},
  };
  return styles;
}

std::string known_styles() {
  std::string out;
  for (const auto& [name, style] : mapped_styles()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// `plan_key`: where a config holds the plan ("base_model_tp_plan", "base_model_ep_plan").
ParallelizePlan plan_from(const std::string& json_text, const std::string& plan_key, const std::string& base_model_prefix,
                          const std::string& source, bool strict) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    throw DTensorError(source + " is not JSON: " + e.what());
  }
  std::string prefix;
  // A config (config.json names its model_type) holds the plan in base_model_tp_plan, if it has one.
  if (doc.is_object() && (doc.contains(plan_key) || doc.contains("model_type"))) {
    const json plan = doc.contains(plan_key) ? doc[plan_key] : json(nullptr);
    doc = plan.is_null() ? json::object() : plan;
    if (!base_model_prefix.empty()) prefix = base_model_prefix + ".";
  }
  if (!doc.is_object())
    throw DTensorError(source + ": a tensor-parallel plan is a JSON object of module path -> style name, got " +
                       std::string(doc.type_name()));
  ParallelizePlan plan;
  for (const auto& [path, style] : doc.items()) {
    const std::string entry = source + ": entry '" + path + "'";
    if (!style.is_string()) throw DTensorError(entry + ": the style must be a string, got " + std::string(style.type_name()));
    const std::string name = style.get<std::string>();
    if (auto it = mapped_styles().find(name); it != mapped_styles().end()) {
      if (it->second) plan.push_back({prefix + path, *it->second, /*optional=*/!strict});
    } else if (auto refused = refused_styles().find(name); refused != refused_styles().end()) {
      throw DTensorError(entry + ": the Hugging Face style '" + name + "' (" + refused->second +
                         ") has no graph-level mapping in dtensor yet; styles mapped: " + known_styles());
    } else {
      throw DTensorError(entry + ": '" + name + "' is no Hugging Face tensor-parallel style that dtensor knows; styles mapped: " +
                         known_styles());
    }
  }
  return plan;
}

}  // namespace

ParallelizePlan hugging_face_plan(const std::string& json_text, const std::string& base_model_prefix, const std::string& source,
                                  bool strict) {
  return plan_from(json_text, "base_model_tp_plan", base_model_prefix, source, strict);
}

ParallelizePlan hugging_face_ep_plan(const std::string& json_text, const std::string& base_model_prefix, const std::string& source,
                                     bool strict) {
  return plan_from(json_text, "base_model_ep_plan", base_model_prefix, source, strict);
}

}  // namespace dtensor::graph
