#pragma once
// nlohmann/json for all of dtensor's code, with JSON_DIAGNOSTICS on: a type error from a decode
// (torch's generated serialization types read untrusted .pt2 records) then carries the JSON pointer of
// the value that failed, which the readers turn into "node 'addmm': field 'inputs[1].arg'". The macro
// changes nlohmann's types (an ABI-tagged namespace), so every dtensor file includes nlohmann through
// here, first: one that includes it another way before this header fails the assertion below.
#ifndef JSON_DIAGNOSTICS
#define JSON_DIAGNOSTICS 1
#endif
#include <nlohmann/json.hpp>

static_assert(JSON_DIAGNOSTICS == 1, "include src/io/json.h before nlohmann/json.hpp or torch's generated_serialization_types.h");
