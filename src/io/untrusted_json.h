#pragma once
// JSON read from files dtensor did not write (a .pt2's model.json, safetensors headers, checkpoint
// indexes): parsed with limits, then read through JsonField, which checks presence, type and range
// of every value it hands out and names the file and the field in every error. Nothing here throws
// anything but DTensorError, and no value is walked recursively without the parse's depth limit.

#include "json.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtensor::io {

using Json = nlohmann::json;

// Far deeper than what torch.export and the safetensors writers produce (the suite's models nest
// at most 10 levels), shallow enough that recursive walks (dump, copies) stay far from the
// stack's end.
inline constexpr int kMaxJsonDepth = 128;

// Parses `text`, read from `source` (a file name, or "file: record"). Refuses, with a DTensorError
// naming `source`: invalid JSON (with its byte offset), nesting deeper than `max_depth`, and an object
// holding the same key twice (nlohmann would silently keep the last one).
Json parse_untrusted_json(std::string_view text, const std::string& source, int max_depth = kMaxJsonDepth);

// What a value is, for "expected X, found Y": its type and a short excerpt, never the whole value
// ("an integer 7", "an object of 2 members").
std::string describe_json_value(const Json& value);

// A value inside a parsed document, with where it came from. A view: the document and the `where`
// string must outlive it.
class JsonField {
 public:
  // `where` names the document and what in it is being read ("gpt.pt2: models/model.json: node
  // 'addmm'"); `path` is the field's path below that ("inputs[0].arg").
  JsonField(const Json& value, const std::string& where, std::string path = "")
      : value_(&value), where_(&where), path_(std::move(path)) {}

  const Json& json() const { return *value_; }
  const std::string& path() const { return path_; }
  const std::string& where() const { return *where_; }
  bool is_null() const { return value_->is_null(); }

  // A member of an object: `at` requires it; `find` gives nullopt when it is absent.
  JsonField at(const std::string& key) const;
  std::optional<JsonField> find(const std::string& key) const;
  bool has(const std::string& key) const { return value_->is_object() && value_->contains(key); }
  // An array's elements.
  std::vector<JsonField> elements() const;
  // An object's members, in key order.
  std::vector<std::pair<std::string, JsonField>> members() const;
  // The one member of an object that must have exactly one (a serialized union: {"as_int": 3}).
  std::pair<std::string, JsonField> only_member() const;

  // An integer within int64 (not a float, a bool or a string), and within [min, max].
  int64_t as_int(int64_t min = INT64_MIN, int64_t max = INT64_MAX) const;
  std::vector<int64_t> as_ints(int64_t min = INT64_MIN, int64_t max = INT64_MAX) const;
  double as_number() const;
  bool as_bool() const;
  const std::string& as_string() const;

  // "<where>: field '<path>': <what>".
  [[noreturn]] void fail(const std::string& what) const;
  // describe_json_value of this value.
  std::string found() const { return describe_json_value(*value_); }

 private:
  JsonField child(const Json& value, std::string path) const { return JsonField(value, *where_, std::move(path)); }
  std::string child_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const Json* value_;
  const std::string* where_;
  std::string path_;
};

}  // namespace dtensor::io
