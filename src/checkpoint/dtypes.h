#pragma once
// LibTorch dtypes as safetensors names them (and Python, for PyTorch's DCP format).

#include <c10/core/ScalarType.h>

#include <string>

namespace dtensor::checkpoint::detail {

// Throws DTensorError naming `tensor` for a dtype safetensors cannot store.
std::string safetensors_dtype(c10::ScalarType dtype, const std::string& tensor);
// Python's name of the dtype ("bfloat16" for torch.bfloat16), for the same dtypes.
std::string torch_dtype_name(c10::ScalarType dtype, const std::string& tensor);
// The LibTorch dtype of a safetensors dtype name; throws naming `tensor` and `file` for others.
c10::ScalarType scalar_type_of(const std::string& dtype, const std::string& tensor, const std::string& file);
// Bytes per element of a safetensors dtype ("F32", "BF16", ...), from the same table; throws for others.
int64_t safetensors_element_size(const std::string& dtype);

}  // namespace dtensor::checkpoint::detail
