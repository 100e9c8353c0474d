#include "integer_ops.h"

#include "dtensor/errors.h"

namespace dtensor::graph::detail {

int64_t apply_integer_operator(const std::string& target, const std::vector<int64_t>& v, const std::string& node) {
  const std::string op = target.substr(std::string("_operator.").size());
  auto floordiv = [](int64_t a, int64_t b) {
    const int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
  };
  if (op == "neg" && v.size() == 1) return -v[0];
  if (v.size() == 2) {
    if (op == "add") return v[0] + v[1];
    if (op == "sub") return v[0] - v[1];
    if (op == "mul") return v[0] * v[1];
    if (op == "floordiv") return floordiv(v[0], v[1]);
    if (op == "mod") return v[0] - floordiv(v[0], v[1]) * v[1];
  }
  throw DTensorError("graph: node '" + node + "': unsupported integer operator " + target);
}

}  // namespace dtensor::graph::detail
