#pragma once
// Pointing a module's parameter at another tensor for a while (fully_shard swaps a group's sharded
// parameters for their gathered values around each forward), without replace_parameter's check for
// other holders: the sharded parameter is meant to stay held (by the optimizer, by the group).

#include <ATen/core/Tensor.h>

#include <string>

namespace torch::nn {
class Module;
}

namespace dtensor::detail {

// Sets the registry entry `name` of `module` and, for the module types dtensor knows, the public member
// that holds it, to `value`. Throws DTensorError when the module has no such parameter.
void set_parameter_slots(torch::nn::Module& module, const std::string& name, const at::Tensor& value);

}  // namespace dtensor::detail
