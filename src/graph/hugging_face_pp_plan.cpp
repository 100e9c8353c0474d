// Hugging Face pipeline plans (model.pp_plan, base_model_pp_plan) as split points: program_stages.h.

#include <algorithm>
#include <cctype>

#include "../io/json.h"
#include "dtensor/errors.h"
#include "dtensor/graph/program_stages.h"
#include "dtensor/pipeline_split.h"

namespace dtensor::graph {
namespace {

using json = nlohmann::ordered_json;

// transformers writes an entry as (inputs, outputs): two lists of argument names.
bool is_entry(const json& value) {
  if (!value.is_array() || value.size() != 2) return false;
  return std::all_of(value.begin(), value.end(), [](const json& names) {
    return names.is_array() && std::all_of(names.begin(), names.end(), [](const json& n) { return n.is_string(); });
  });
}

// A module of the plan: its path and where its first parameter comes among the program's.
struct PlanModule {
  std::string path;
  size_t first = 0;
};

// The layer index right after `path`. in `name` ("3" in "model.layers.3.mlp.w"), "" where none.
std::string layer_index(const std::string& name, const std::string& path) {
  const std::string rest = name.substr(path.size() + 1);
  const std::string index = rest.substr(0, rest.find('.'));
  const bool digits = !index.empty() && std::all_of(index.begin(), index.end(), [](unsigned char c) { return std::isdigit(c); });
  return digits && index.size() < rest.size() ? index : "";
}

}  // namespace

std::vector<std::string> pp_plan_split_points(const Program& program, const std::string& json_text, int num_stages,
                                              const std::string& base_model_prefix, const std::string& source) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    throw DTensorError(source + " is not JSON: " + e.what());
  }
  if (!doc.is_object() || doc.empty())
    throw DTensorError(source + ": a pipeline plan is a JSON object of module path -> [[inputs], [outputs]], got " + std::string(doc.type_name()));
  std::vector<std::string> parameters;
  for (const InputSpec& spec : program.inputs)
    if (spec.kind == InputSpec::Kind::Parameter) parameters.push_back(spec.target);
  std::vector<PlanModule> modules;
  std::string layers_prefix;
  for (const auto& [key, value] : doc.items()) {
    const std::string entry = source + ": entry '" + key + "'";
    if (!is_entry(value)) throw DTensorError(entry + " is not [[input names], [output names]], as transformers writes a pipeline plan");
    const std::string path = base_model_prefix.empty() ? key : base_model_prefix + "." + key;
    std::vector<PlanModule> found;
    bool list = true;
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (parameters[i].rfind(path + ".", 0) != 0) continue;
      const std::string index = layer_index(parameters[i], path);
      list = list && !index.empty();
      const std::string module = index.empty() ? path : path + "." + index;
      if (std::none_of(found.begin(), found.end(), [&](const PlanModule& m) { return m.path == module; })) found.push_back({module, i});
    }
    if (found.empty())
      throw DTensorError(entry + " names no module of " + (program.source.empty() ? std::string("the program") : program.source) +
                         " with parameters" + (base_model_prefix.empty() ? "" : " (under the base model prefix '" + base_model_prefix + "')"));
    if (list && !layers_prefix.empty())
      throw DTensorError(entry + ": a second list of layers after '" + layers_prefix + "'; the plan spreads one list over the stages");
    if (list) layers_prefix = path + ".";
    else found = {{path, found.front().first}};
    modules.insert(modules.end(), found.begin(), found.end());
  }
  if (layers_prefix.empty()) throw DTensorError(source + ": no entry is a list of layers (such as model.layers), which the stages share out");
  std::sort(modules.begin(), modules.end(), [](const PlanModule& a, const PlanModule& b) { return a.first < b.first; });
  std::vector<std::string> paths;
  for (const PlanModule& m : modules) paths.push_back(m.path);
  return pipeline::even_split_points(paths, layers_prefix, num_stages);
}

}  // namespace dtensor::graph
