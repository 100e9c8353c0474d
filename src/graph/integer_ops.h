#pragma once
// Python's integer operators on symbolic sizes, as torch.export writes them (_operator.add, ...):
// evaluated by the interpreter at run time and by SPMD expansion on local sizes while planning.
// Operands come from files, so nothing here may divide by zero or overflow: such a case is an error
// naming the node, never a signal or a wrapped value.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtensor::graph::detail {

// Why a node calling `target` ("_operator.<name>") on these operands (the constant ones known,
// nullopt for symbolic ones) cannot be evaluated: an unknown operator, the wrong operand count, a
// constant divisor of 0, or constants whose result overflows. "" when it can.
std::string integer_operator_problem(const std::string& target, const std::vector<std::optional<int64_t>>& operands);

// Python's semantics on int64 (floordiv and mod round toward negative infinity); a zero divisor or a
// result outside int64 is a DTensorError starting with `where` (the program and the node).
int64_t apply_integer_operator(const std::string& target, const std::vector<int64_t>& operands, const std::string& where);

}  // namespace dtensor::graph::detail
