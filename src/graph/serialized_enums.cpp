#include "serialized_enums.h"

#include <string>
#include <utility>
#include <vector>

#include "dtensor/errors.h"

namespace dtensor::graph::detail {
namespace {

using c10::ScalarType;

// schema.yaml's ScalarType: c10's order shifted by one up to Bool, then its own numbering.
const std::vector<std::pair<int64_t, ScalarType>> kScalarTypes = {
    {1, ScalarType::Byte},          {2, ScalarType::Char},          {3, ScalarType::Short},
    {4, ScalarType::Int},           {5, ScalarType::Long},          {6, ScalarType::Half},
    {7, ScalarType::Float},         {8, ScalarType::Double},        {9, ScalarType::ComplexHalf},
    {10, ScalarType::ComplexFloat}, {11, ScalarType::ComplexDouble}, {12, ScalarType::Bool},
    {13, ScalarType::BFloat16},     {28, ScalarType::UInt16},       {29, ScalarType::Float8_e4m3fn},
    {30, ScalarType::Float8_e5m2},  {31, ScalarType::Float8_e4m3fnuz}, {32, ScalarType::Float8_e5m2fnuz},
    {34, ScalarType::UInt32},       {35, ScalarType::UInt64},
};
const std::vector<std::pair<int64_t, c10::Layout>> kLayouts = {
    {1, c10::kSparse}, {2, c10::kSparseCsr}, {3, c10::kSparseCsc}, {4, c10::kSparseBsr},
    {5, c10::kSparseBsc}, {6, c10::kMkldnn}, {7, c10::kStrided}};
const std::vector<std::pair<int64_t, c10::MemoryFormat>> kMemoryFormats = {
    {1, c10::MemoryFormat::Contiguous}, {2, c10::MemoryFormat::ChannelsLast},
    {3, c10::MemoryFormat::ChannelsLast3d}, {4, c10::MemoryFormat::Preserve}};

template <typename T>
std::optional<T> from(const std::vector<std::pair<int64_t, T>>& table, int64_t code) {
  for (const auto& [c, v] : table)
    if (c == code) return v;
  return std::nullopt;
}

template <typename T>
int64_t to(const std::vector<std::pair<int64_t, T>>& table, T value, const char* what) {
  for (const auto& [c, v] : table)
    if (v == value) return c;
  throw DTensorError(std::string("pt2 writer: no serialized form for this ") + what);
}

}  // namespace

std::optional<c10::ScalarType> scalar_type_from_serialized(int64_t code) { return from(kScalarTypes, code); }
int64_t serialized_scalar_type(c10::ScalarType type) { return to(kScalarTypes, type, "dtype"); }
std::optional<c10::Layout> layout_from_serialized(int64_t code) { return from(kLayouts, code); }
int64_t serialized_layout(c10::Layout layout) { return to(kLayouts, layout, "layout"); }
std::optional<c10::MemoryFormat> memory_format_from_serialized(int64_t code) { return from(kMemoryFormats, code); }
int64_t serialized_memory_format(c10::MemoryFormat format) { return to(kMemoryFormats, format, "memory format"); }

}  // namespace dtensor::graph::detail
