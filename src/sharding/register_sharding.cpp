// register_sharding: PyTorch's way of stating an op's strategies (per argument, None for the ones
// that are not tensors) turned into dtensor's per-mesh-dim strategies.

#include <set>

#include "dtensor/errors.h"
#include "dtensor/sharding.h"

namespace dtensor {
namespace {

DimStrategy dim_strategy(const AcceptableSharding& given, const OpSchema& schema, const std::string& op) {
  const auto& arguments = schema.schema.arguments();
  const std::string what = "register_sharding for " + op + ": an acceptable sharding ";
  DimStrategy out;
  std::set<size_t> tensor_arguments;
  for (const TensorInput& input : schema.inputs) {
    tensor_arguments.insert(input.arg);
    const std::optional<Placement>& p = input.arg < given.inputs.size() ? given.inputs[input.arg] : std::nullopt;
    if (!p)
      throw DTensorError(what + "gives no placement for the tensor argument '" + arguments[input.arg].name() + "' (argument " +
                         std::to_string(input.arg) + "); give one per argument, nullopt for those that are not tensors");
    out.inputs.push_back(*p);
  }
  for (size_t i = 0; i < given.inputs.size(); ++i)
    if (given.inputs[i] && !tensor_arguments.count(i))
      throw DTensorError(what + "gives " + given.inputs[i]->str() + " for argument " + std::to_string(i) +
                         (i < arguments.size() ? " ('" + arguments[i].name() + "')" : "") +
                         ", which holds no tensor in this call; give nullopt there");
  for (const auto& p : given.outputs)
    if (p) out.outputs.push_back(*p);
  if (out.outputs.size() != schema.outputs.size())
    throw DTensorError(what + "gives " + std::to_string(out.outputs.size()) + " output placements for the op's " +
                       std::to_string(schema.outputs.size()) + " tensor outputs");
  return out;
}

}  // namespace

void register_sharding(const std::vector<std::string>& ops, const ShardingFn& fn) {
  if (ops.empty()) throw DTensorError("register_sharding: name at least one op");
  if (!fn) throw DTensorError("register_sharding: the sharding function is empty");
  for (const std::string& op : ops)
    register_dim_rule(op, [fn, op](const OpSchema& schema) {
      std::vector<DimStrategy> strategies;
      for (const AcceptableSharding& given : fn(schema)) strategies.push_back(dim_strategy(given, schema, op));
      return strategies;
    });
}

}  // namespace dtensor
