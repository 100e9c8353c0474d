#include "pt2_decoding.h"

#include <bit>
#include <cmath>
#include <limits>

#include "dtensor/errors.h"
#include "pt2_decoding_support.h"
#include "pt2_records.h"

namespace dtensor::graph::detail {
namespace decoding {

void decode(Reader& in, int64_t& out) {
  const size_t at = in.offset();
  if (in.peek() != JsonPull::Kind::Number) in.fail_expected("an integer");
  const JsonPull::Number n = in.read_number();
  if (n.type == JsonPull::Number::Type::Signed) {
    out = n.signed_value;
    return;
  }
  // torch's writer spells integers as integers: a float here (2.0 included) is refused, not rounded.
  constexpr double kTwoTo63 = 9223372036854775808.0;
  const bool beyond = n.type == JsonPull::Number::Type::Unsigned || std::fabs(n.float_value) >= kTwoTo63;
  JsonPull::fail(at, "expected an integer, found " + in.describe_at(at) + (beyond ? ", beyond any 64-bit integer" : ""));
}

void decode(Reader& in, bool& out) { out = in.read_bool(); }

void decode(Reader& in, std::string& out) { in.read_string(out); }

void decode(Reader& in, std::vector<bool>& out) {
  in.begin_array();
  while (in.next_element()) out.push_back(in.read_bool());
}

// A double: a number, or the strings torch writes for what JSON numbers cannot hold.
void decode(Reader& in, ex::F64& out) {
  if (in.peek() == JsonPull::Kind::String) {
    const size_t at = in.offset();
    std::string text;
    in.read_string(text);
    if (text == "Infinity") return out.set(std::numeric_limits<double>::infinity());
    if (text == "-Infinity") return out.set(-std::numeric_limits<double>::infinity());
    if (text == "NaN") return out.set(std::numeric_limits<double>::quiet_NaN());
    JsonPull::fail(at, "does not fit torch's export schema (expected a number, \"Infinity\", \"-Infinity\" or \"NaN\"): found " +
                           in.describe_at(at));
  }
  if (in.peek() != JsonPull::Kind::Number) in.fail_expected("a number");
  const JsonPull::Number n = in.read_number();
  switch (n.type) {
    case JsonPull::Number::Type::Signed: return out.set(static_cast<double>(n.signed_value));
    case JsonPull::Number::Type::Unsigned: return out.set(static_cast<double>(n.unsigned_value));
    case JsonPull::Number::Type::Float: return out.set(n.float_value);
  }
}

int64_t decode_enum_code(Reader& in, std::span<const int64_t> values, const char* type) {
  const size_t at = in.offset();
  int64_t code = 0;
  decode(in, code);
  for (const int64_t value : values)
    if (value == code) return code;
  JsonPull::fail(at, std::string("expected a ") + type + " code of torch's export schema, found " + in.describe_at(at));
}

void fail_repeated_key(size_t object_at, std::string_view key) {
  JsonPull::fail(object_at, "an object holds the key '" + std::string(key.substr(0, 80)) + "' twice");
}

StructMembers::StructMembers(Reader& in, std::span<const std::string_view> names, uint64_t required)
    : in_(in), names_(names), required_(required), object_at_(in.offset()) {
  in_.begin_object();
}

int StructMembers::next() {
  std::string_view key;
  if (!in_.next_member(key)) {
    if (const uint64_t missing = required_ & ~seen_)
      JsonPull::fail(object_at_, "the member is missing", std::string(names_[std::countr_zero(missing)]));
    return -1;
  }
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] != key) continue;
    if (seen_ & (uint64_t{1} << i)) fail_repeated_key(object_at_, key);
    seen_ |= uint64_t{1} << i;
    return static_cast<int>(i);
  }
  JsonPull::fail(object_at_, "has the member '" + std::string(key.substr(0, 80)) + "', which torch 2.15's export schema does not have here");
}

UnionMember::UnionMember(Reader& in, std::span<const std::string_view> names) : in_(in), object_at_(in.offset()) {
  if (in_.peek() != JsonPull::Kind::Object)
    JsonPull::fail(object_at_, "expected an object with one member (a union), found " + in_.describe_at(object_at_));
  in_.begin_object();
  std::string_view key;
  if (!in_.next_member(key)) JsonPull::fail(object_at_, "expected an object with one member (a union), found an empty object");
  for (size_t i = 0; i < names.size() && index_ < 0; ++i)
    if (names[i] == key) index_ = static_cast<int>(i);
  if (index_ < 0)
    JsonPull::fail(object_at_, "none of its members ('" + std::string(key.substr(0, 40)) + "', ...) is one torch's export schema allows here");
}

void UnionMember::finish() {
  std::string_view key;
  if (in_.next_member(key))
    JsonPull::fail(object_at_, "has a second member '" + std::string(key.substr(0, 80)) + "', but a union holds exactly one");
}

}  // namespace decoding

namespace {

// The place of a decoding problem, from a rescan of the record's text (errors only).
std::string place_of(std::string_view text, const io::JsonPull::Problem& problem) {
  std::vector<io::JsonPathStep> steps = io::json_path_to(text, problem.offset);
  if (!problem.member.empty()) steps.push_back({problem.member, std::nullopt, 0});
  std::vector<PlaceToken> tokens;
  for (const io::JsonPathStep& step : steps) tokens.push_back({step.key, step.index});
  // Inside a node of models/model.json: named by the node's name, which may come after the problem.
  const bool in_node = steps.size() >= 4 && steps[0].key == "graph_module" && steps[1].key == "graph" && steps[2].key == "nodes";
  const std::optional<std::string> node = in_node ? io::json_string_member(text, steps[3].value_offset, "name") : std::nullopt;
  if (node && !node->empty()) return describe_place(*node, std::span(tokens).subspan(4));
  return describe_place(std::nullopt, tokens);
}

template <class T>
void decode_text(std::string_view text, const std::string& where, T& out) {
  decoding::Reader in(text);
  try {
    decoding::decode(in, out);
    in.finish();
  } catch (const io::JsonPull::Problem& problem) {
    const std::string place = place_of(text, problem);
    throw DTensorError(where + (place.empty() ? "" : ": " + place) + ": " + problem.what);
  }
}

}  // namespace

void decode_record(std::string_view text, const std::string& where, ex::ExportedProgram& out) { decode_text(text, where, out); }
void decode_record(std::string_view text, const std::string& where, ex::PayloadConfig& out) { decode_text(text, where, out); }

}  // namespace dtensor::graph::detail
