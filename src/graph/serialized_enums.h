#pragma once
// torch.export's serialized enums (torch/_export/serde/schema.yaml, generated into
// torch/csrc/utils/generated_serialization_types.h) are not c10's: the mapping both ways, for the
// reader (which reads the codes as numbers from an untrusted file) and the writer.

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include "../io/json.h"
#include <torch/csrc/utils/generated_serialization_types.h>

#include <cstdint>
#include <optional>

namespace dtensor::graph::detail {

// nullopt for a code the schema lacks (or one c10 lacks).
std::optional<c10::ScalarType> scalar_type_from_serialized(int64_t code);
torch::_export::ScalarType serialized_scalar_type(c10::ScalarType type);  // throws DTensorError for a type schema.yaml lacks

std::optional<c10::Layout> layout_from_serialized(int64_t code);
torch::_export::Layout serialized_layout(c10::Layout layout);

std::optional<c10::MemoryFormat> memory_format_from_serialized(int64_t code);
torch::_export::MemoryFormat serialized_memory_format(c10::MemoryFormat format);

}  // namespace dtensor::graph::detail
