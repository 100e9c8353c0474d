#include "serialized_enums.h"

#include <string>
#include <utility>
#include <vector>

#include "dtensor/errors.h"

namespace dtensor::graph::detail {
namespace {

namespace ex = torch::_export;
using c10::ScalarType;

// Scalar types that older LibTorch's export schema lacks (2.11, on the GPU machines): listed where
// this LibTorch's generated enum has them.
template <class E = ex::ScalarType>
std::vector<std::pair<E, ScalarType>> with_newer_scalar_types(std::vector<std::pair<E, ScalarType>> types) {
  if constexpr (requires { E::FLOAT8E8M0FNU; }) types.emplace_back(E::FLOAT8E8M0FNU, ScalarType::Float8_e8m0fnu);
  if constexpr (requires { E::UINT32; }) types.emplace_back(E::UINT32, ScalarType::UInt32);
  if constexpr (requires { E::UINT64; }) types.emplace_back(E::UINT64, ScalarType::UInt64);
  return types;
}

const std::vector<std::pair<ex::ScalarType, ScalarType>> kScalarTypes = with_newer_scalar_types({
    {ex::ScalarType::BYTE, ScalarType::Byte},
    {ex::ScalarType::CHAR, ScalarType::Char},
    {ex::ScalarType::SHORT, ScalarType::Short},
    {ex::ScalarType::INT, ScalarType::Int},
    {ex::ScalarType::LONG, ScalarType::Long},
    {ex::ScalarType::HALF, ScalarType::Half},
    {ex::ScalarType::FLOAT, ScalarType::Float},
    {ex::ScalarType::DOUBLE, ScalarType::Double},
    {ex::ScalarType::COMPLEXHALF, ScalarType::ComplexHalf},
    {ex::ScalarType::COMPLEXFLOAT, ScalarType::ComplexFloat},
    {ex::ScalarType::COMPLEXDOUBLE, ScalarType::ComplexDouble},
    {ex::ScalarType::BOOL, ScalarType::Bool},
    {ex::ScalarType::BFLOAT16, ScalarType::BFloat16},
    {ex::ScalarType::UINT16, ScalarType::UInt16},
    {ex::ScalarType::FLOAT8E4M3FN, ScalarType::Float8_e4m3fn},
    {ex::ScalarType::FLOAT8E5M2, ScalarType::Float8_e5m2},
    {ex::ScalarType::FLOAT8E4M3FNUZ, ScalarType::Float8_e4m3fnuz},
    {ex::ScalarType::FLOAT8E5M2FNUZ, ScalarType::Float8_e5m2fnuz},
});

const std::vector<std::pair<ex::Layout, c10::Layout>> kLayouts = {
    {ex::Layout::SparseCoo, c10::kSparse},    {ex::Layout::SparseCsr, c10::kSparseCsr}, {ex::Layout::SparseCsc, c10::kSparseCsc},
    {ex::Layout::SparseBsr, c10::kSparseBsr}, {ex::Layout::SparseBsc, c10::kSparseBsc}, {ex::Layout::_mkldnn, c10::kMkldnn},
    {ex::Layout::Strided, c10::kStrided}};
const std::vector<std::pair<ex::MemoryFormat, c10::MemoryFormat>> kMemoryFormats = {
    {ex::MemoryFormat::ContiguousFormat, c10::MemoryFormat::Contiguous},
    {ex::MemoryFormat::ChannelsLast, c10::MemoryFormat::ChannelsLast},
    {ex::MemoryFormat::ChannelsLast3d, c10::MemoryFormat::ChannelsLast3d},
    {ex::MemoryFormat::PreserveFormat, c10::MemoryFormat::Preserve}};

template <typename E, typename T>
std::optional<T> from(const std::vector<std::pair<E, T>>& table, int64_t code) {
  for (const auto& [e, v] : table)
    if (static_cast<int64_t>(e) == code) return v;
  return std::nullopt;
}

template <typename E, typename T>
E to(const std::vector<std::pair<E, T>>& table, T value, const char* what) {
  for (const auto& [e, v] : table)
    if (v == value) return e;
  throw DTensorError(std::string("pt2 writer: no serialized form for this ") + what);
}

}  // namespace

std::optional<c10::ScalarType> scalar_type_from_serialized(int64_t code) { return from(kScalarTypes, code); }
ex::ScalarType serialized_scalar_type(c10::ScalarType type) { return to(kScalarTypes, type, "dtype"); }
std::optional<c10::Layout> layout_from_serialized(int64_t code) { return from(kLayouts, code); }
ex::Layout serialized_layout(c10::Layout layout) { return to(kLayouts, layout, "layout"); }
std::optional<c10::MemoryFormat> memory_format_from_serialized(int64_t code) { return from(kMemoryFormats, code); }
ex::MemoryFormat serialized_memory_format(c10::MemoryFormat format) { return to(kMemoryFormats, format, "memory format"); }

}  // namespace dtensor::graph::detail
