#pragma once
// Python's integer operators on symbolic sizes, as torch.export writes them (_operator.add, ...):
// evaluated by the interpreter at run time and by SPMD expansion on local sizes while planning.

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor::graph::detail {

// `target` is "_operator.<name>"; `node` names the node in errors.
int64_t apply_integer_operator(const std::string& target, const std::vector<int64_t>& operands, const std::string& node);

}  // namespace dtensor::graph::detail
