#pragma once
// The JSON records of a .pt2 (models/model.json, the weights and constants configs) are untrusted.
// They are decoded in one pass over their text, straight into torch's generated serialization types
// (generated_serialization_types.h, made from torch/_export/serde/schema.yaml), by decoders generated
// from the same schema (pt2_schema_decoder.cpp, scripts/generate_pt2_decoder.py). Where torch's own
// from_json is lenient, these are strict, stricter than torch's Python deserializer too (which skips
// members it does not know and takes primitives as they come): torch's writer produces none of what
// they refuse, and what is refused cannot be read wrongly:
//  - a value of the wrong JSON type is refused (16.5, 2.0 or true where an integer belongs; 2^64-1,
//    which int64 cannot hold);
//  - a member the schema does not have, a member given twice, a struct member without a default in
//    the schema that is absent, a union with no member, an unknown one or two, an enum code the
//    schema does not list.
// Each refusal names its place: "<where>: node 'addmm': field 'inputs[1].arg': <what>" inside
// models/model.json's nodes, "<where>: field 'config.fc1.weight.path_name': <what>" elsewhere. The
// readers then check meaning on the decoded values (pt2_graph_reader.cpp, pt2_reader.cpp), naming
// what they refuse through RecordField (pt2_records.h).

#include <string>
#include <string_view>

#include "../io/json.h"
#include <torch/csrc/utils/generated_serialization_types.h>

#include "../io/json_pull.h"

namespace dtensor::graph::detail {

namespace ex = torch::_export;

// Decodes the JSON record `text`; `where` names it ("gpt.pt2: models/model.json").
void decode_record(std::string_view text, const std::string& where, ex::ExportedProgram& out);
void decode_record(std::string_view text, const std::string& where, ex::PayloadConfig& out);

}  // namespace dtensor::graph::detail
