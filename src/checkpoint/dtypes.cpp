#include "dtypes.h"

#include <utility>
#include <vector>

#include "dtensor/errors.h"

namespace dtensor::checkpoint::detail {
namespace {

struct Dtype {
  c10::ScalarType type;
  std::string safetensors;  // safetensors' name
  std::string torch;        // Python's: torch.<name>
};

const std::vector<Dtype>& table() {
  static const std::vector<Dtype> t = {
      {c10::kDouble, "F64", "float64"},   {c10::kFloat, "F32", "float32"},   {c10::kHalf, "F16", "float16"},
      {c10::kBFloat16, "BF16", "bfloat16"}, {c10::kFloat8_e4m3fn, "F8_E4M3", "float8_e4m3fn"},
      {c10::kFloat8_e5m2, "F8_E5M2", "float8_e5m2"}, {c10::kLong, "I64", "int64"}, {c10::kInt, "I32", "int32"},
      {c10::kShort, "I16", "int16"},      {c10::kChar, "I8", "int8"},        {c10::kUInt64, "U64", "uint64"},
      {c10::kUInt32, "U32", "uint32"},    {c10::kUInt16, "U16", "uint16"},   {c10::kByte, "U8", "uint8"},
      {c10::kBool, "BOOL", "bool"},       {c10::kComplexFloat, "C64", "complex64"}};
  return t;
}

}  // namespace

std::string safetensors_dtype(c10::ScalarType dtype, const std::string& tensor) {
  for (const Dtype& d : table())
    if (d.type == dtype) return d.safetensors;
  throw DTensorError("checkpoint: tensor '" + tensor + "' is " + c10::toString(dtype) +
                     ", which safetensors cannot store; convert it first");
}

std::string torch_dtype_name(c10::ScalarType dtype, const std::string& tensor) {
  for (const Dtype& d : table())
    if (d.type == dtype) return d.torch;
  return safetensors_dtype(dtype, tensor);  // throws: both names come from one table
}

int64_t safetensors_element_size(const std::string& dtype) {
  for (const Dtype& d : table())
    if (d.safetensors == dtype) return static_cast<int64_t>(c10::elementSize(d.type));
  throw DTensorError("checkpoint: unknown safetensors dtype '" + dtype + "'");
}

c10::ScalarType scalar_type_of(const std::string& dtype, const std::string& tensor, const std::string& file) {
  for (const Dtype& d : table())
    if (d.safetensors == dtype) return d.type;
  throw DTensorError("checkpoint: " + file + ": tensor '" + tensor + "' has dtype " + dtype + ", which LibTorch lacks");
}

}  // namespace dtensor::checkpoint::detail
