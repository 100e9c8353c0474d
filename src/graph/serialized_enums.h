#pragma once
// torch.export's serialized enums (torch/_export/serde/schema.yaml) are not c10's: the tables both
// ways, for the reader and the writer.

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>

namespace dtensor::graph::detail {

std::optional<c10::ScalarType> scalar_type_from_serialized(int64_t code);
int64_t serialized_scalar_type(c10::ScalarType type);  // throws DTensorError for a type schema.yaml lacks

std::optional<c10::Layout> layout_from_serialized(int64_t code);
int64_t serialized_layout(c10::Layout layout);

std::optional<c10::MemoryFormat> memory_format_from_serialized(int64_t code);
int64_t serialized_memory_format(c10::MemoryFormat format);

}  // namespace dtensor::graph::detail
