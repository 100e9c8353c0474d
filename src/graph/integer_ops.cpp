#include "integer_ops.h"

#include "../io/checked_int.h"
#include "dtensor/errors.h"

namespace dtensor::graph::detail {
namespace {

const std::string kPrefix = "_operator.";

// The operand count of each operator dtensor evaluates; 0 for an unknown one.
size_t arity(const std::string& target) {
  if (target.rfind(kPrefix, 0) != 0) return 0;
  const std::string op = target.substr(kPrefix.size());
  if (op == "neg") return 1;
  if (op == "add" || op == "sub" || op == "mul" || op == "floordiv" || op == "mod") return 2;
  return 0;
}

// The result, or why there is none.
std::optional<int64_t> evaluate(const std::string& op, const std::vector<int64_t>& v, std::string& why) {
  if (op == "neg") return io::checked_mul(v[0], -1);
  if (op == "add") return io::checked_add(v[0], v[1]);
  if (op == "sub") return io::checked_sub(v[0], v[1]);
  if (op == "mul") return io::checked_mul(v[0], v[1]);
  // floordiv and mod
  if (v[1] == 0) {
    why = "integer division by zero";
    return std::nullopt;
  }
  if (v[0] == INT64_MIN && v[1] == -1) return op == "mod" ? std::optional<int64_t>(0) : std::nullopt;
  const int64_t q = v[0] / v[1], r = v[0] % v[1];
  const bool round_down = r != 0 && ((r < 0) != (v[1] < 0));
  if (op == "floordiv") return round_down ? q - 1 : q;
  return round_down ? r + v[1] : r;
}

}  // namespace

std::string integer_operator_problem(const std::string& target, const std::vector<std::optional<int64_t>>& operands) {
  const size_t n = arity(target);
  if (n == 0) return "unsupported integer operator " + target + " (dtensor evaluates add, sub, mul, floordiv, mod and neg)";
  if (operands.size() != n)
    return target + " takes " + std::to_string(n) + " operand(s), the node gives " + std::to_string(operands.size());
  const std::string op = target.substr(kPrefix.size());
  if ((op == "floordiv" || op == "mod") && operands[1] == 0) return target + " by the constant 0";
  std::vector<int64_t> constants;
  for (const auto& o : operands)
    if (o) constants.push_back(*o);
  std::string why;
  if (constants.size() == n && !evaluate(op, constants, why))
    return target + " of constants has no int64 result" + (why.empty() ? "" : " (" + why + ")");
  return "";
}

int64_t apply_integer_operator(const std::string& target, const std::vector<int64_t>& v, const std::string& where) {
  const size_t n = arity(target);
  if (n == 0 || v.size() != n) throw DTensorError(where + ": unsupported integer operator " + target);
  std::string why;
  const auto result = evaluate(target.substr(kPrefix.size()), v, why);
  if (!result) {
    std::string operands;
    for (int64_t x : v) operands += (operands.empty() ? "" : ", ") + std::to_string(x);
    throw DTensorError(where + ": " + target + "(" + operands + "): " +
                       (why.empty() ? "the result does not fit int64" : why));
  }
  return *result;
}

}  // namespace dtensor::graph::detail
