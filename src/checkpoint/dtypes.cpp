#include "dtypes.h"

#include <utility>
#include <vector>

#include "dtensor/errors.h"

namespace dtensor::checkpoint::detail {
namespace {

const std::vector<std::pair<c10::ScalarType, std::string>>& table() {
  static const std::vector<std::pair<c10::ScalarType, std::string>> t = {
      {c10::kDouble, "F64"},        {c10::kFloat, "F32"},          {c10::kHalf, "F16"},   {c10::kBFloat16, "BF16"},
      {c10::kFloat8_e4m3fn, "F8_E4M3"}, {c10::kFloat8_e5m2, "F8_E5M2"}, {c10::kLong, "I64"},   {c10::kInt, "I32"},
      {c10::kShort, "I16"},         {c10::kChar, "I8"},            {c10::kUInt64, "U64"}, {c10::kUInt32, "U32"},
      {c10::kUInt16, "U16"},        {c10::kByte, "U8"},            {c10::kBool, "BOOL"},  {c10::kComplexFloat, "C64"}};
  return t;
}

}  // namespace

std::string safetensors_dtype(c10::ScalarType dtype, const std::string& tensor) {
  for (const auto& [type, name] : table())
    if (type == dtype) return name;
  throw DTensorError("checkpoint: tensor '" + tensor + "' is " + c10::toString(dtype) +
                     ", which safetensors cannot store; convert it first");
}

int64_t safetensors_element_size(const std::string& dtype) {
  for (const auto& [type, name] : table())
    if (name == dtype) return static_cast<int64_t>(c10::elementSize(type));
  throw DTensorError("checkpoint: unknown safetensors dtype '" + dtype + "'");
}

c10::ScalarType scalar_type_of(const std::string& dtype, const std::string& tensor, const std::string& file) {
  for (const auto& [type, name] : table())
    if (name == dtype) return type;
  throw DTensorError("checkpoint: " + file + ": tensor '" + tensor + "' has dtype " + dtype + ", which LibTorch lacks");
}

}  // namespace dtensor::checkpoint::detail
