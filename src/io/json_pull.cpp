#include "json_pull.h"

#include <charconv>
#include <algorithm>
#include <cmath>

namespace dtensor::io {
namespace {

bool is_whitespace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A byte of the text for an error message: itself in quotes where printable, else \xNN.
std::string printable(char c) {
  static const char* const kHex = "0123456789abcdef";
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7F) return std::string("'") + c + "'";
  return std::string("\\x") + kHex[u >> 4] + kHex[u & 15];
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string& out, uint32_t code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

}  // namespace

void JsonPull::fail(size_t at, std::string what, std::string member) { throw Problem{at, std::move(member), std::move(what)}; }

void JsonPull::fail_syntax(const std::string& what) const {
  throw Problem{pos_, "", "invalid JSON at byte " + std::to_string(pos_) + " (" + what + "): the file is corrupted"};
}

void JsonPull::fail_expected(const char* expected) {
  const size_t at = offset();
  fail(at, "does not fit torch's export schema (expected " + std::string(expected) + "): found " + describe_at(at));
}

// Kind, size or excerpt, without building the value: it may be large, and this runs only for errors.
// A syntax error inside it is the problem reported instead (the file is corrupted).
std::string JsonPull::describe_at(size_t at) const {
  JsonPull value(text_, max_depth_, at);
  std::string_view key;
  size_t count = 0;
  switch (value.peek()) {
    case Kind::Object:
      value.begin_object();
      for (; value.next_member(key); ++count) value.skip_value();
      return "an object of " + std::to_string(count) + " members";
    case Kind::Array:
      value.begin_array();
      for (; value.next_element(); ++count) value.skip_value();
      return "an array of " + std::to_string(count) + " elements";
    case Kind::Null: return "null";
    default: break;
  }
  const Kind kind = value.peek();
  value.skip_value();
  const std::string_view raw = text_.substr(at, value.pos_ - at);
  size_t cut = std::min<size_t>(raw.size(), 60);
  while (cut < raw.size() && cut > 0 && (static_cast<unsigned char>(raw[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
  const std::string excerpt = std::string(raw.substr(0, cut)) + (cut < raw.size() ? "..." : "");
  if (kind == Kind::Boolean) return "a boolean " + excerpt;
  if (kind == Kind::String) return "a string " + excerpt;
  return (raw.find_first_of(".eE") == std::string_view::npos ? "an integer " : "a fractional number ") + excerpt;
}

void JsonPull::skip_whitespace() {
  while (pos_ < text_.size() && is_whitespace(text_[pos_])) ++pos_;
}

size_t JsonPull::offset() {
  skip_whitespace();
  return pos_;
}

JsonPull::Kind JsonPull::peek() {
  skip_whitespace();
  if (pos_ >= text_.size()) fail_syntax("unexpected end of the text");
  switch (text_[pos_]) {
    case '{': return Kind::Object;
    case '[': return Kind::Array;
    case '"': return Kind::String;
    case 't':
    case 'f': return Kind::Boolean;
    case 'n': return Kind::Null;
    default:
      if (text_[pos_] == '-' || is_digit(text_[pos_])) return Kind::Number;
      fail_syntax("unexpected character " + printable(text_[pos_]));
  }
}

void JsonPull::expect(char c) {
  skip_whitespace();
  if (pos_ >= text_.size() || text_[pos_] != c) fail_syntax(std::string("expected '") + c + "'");
  ++pos_;
}

void JsonPull::enter() {
  if (depth_ >= max_depth_) fail(pos_, "JSON nested deeper than " + std::to_string(max_depth_) + " levels");
  ++depth_;
  first_.push_back(true);
}

void JsonPull::begin_object() {
  if (peek() != Kind::Object) fail_expected("an object");
  enter();
  ++pos_;
}

void JsonPull::begin_array() {
  if (peek() != Kind::Array) fail_expected("an array");
  enter();
  ++pos_;
}

// At an open container's next entry: false, having closed the container, at `close`; else true, past
// the comma that separates entries.
bool JsonPull::next_entry(char close) {
  skip_whitespace();
  if (pos_ < text_.size() && text_[pos_] == close) {
    ++pos_;
    --depth_;
    first_.pop_back();
    return false;
  }
  if (!first_.back()) expect(',');
  first_.back() = false;
  return true;
}

bool JsonPull::next_member(std::string_view& key) {
  if (!next_entry('}')) return false;
  skip_whitespace();
  if (pos_ >= text_.size() || text_[pos_] != '"') fail_syntax("expected a member's key or '}'");
  key = read_string_view(key_scratch_);
  expect(':');
  return true;
}

bool JsonPull::next_element() { return next_entry(']'); }

bool JsonPull::read_bool() {
  if (peek() != Kind::Boolean) fail_expected("true or false");
  const bool value = text_[pos_] == 't';
  const std::string_view word = value ? "true" : "false";
  if (text_.substr(pos_, word.size()) != word) fail_syntax("expected true or false");
  pos_ += word.size();
  return value;
}

bool JsonPull::read_null() {
  if (peek() != Kind::Null) return false;
  if (text_.substr(pos_, 4) != "null") fail_syntax("expected null");
  pos_ += 4;
  return true;
}

void JsonPull::read_string(std::string& out) {
  if (peek() != Kind::String) fail_expected("a string");
  const std::string_view value = read_string_view(out);
  if (value.data() != out.data()) out.assign(value);
}

// At the opening quote. The string's text where it has no escapes (most do not), else its value
// decoded into `scratch`.
std::string_view JsonPull::read_string_view(std::string& scratch) {
  const size_t start = ++pos_;
  bool escaped = false;
  while (true) {
    if (pos_ >= text_.size()) fail_syntax("a string without its closing quote");
    const auto c = static_cast<unsigned char>(text_[pos_]);
    if (c == '"') break;
    if (c < 0x20) fail_syntax("a control character in a string");
    if (c == '\\') {
      if (!escaped) scratch.assign(text_.substr(start, pos_ - start));
      escaped = true;
      append_escape(scratch);
      continue;
    }
    if (c >= 0x80) {
      const size_t from = pos_;
      check_utf8_sequence();
      if (escaped) scratch.append(text_.substr(from, pos_ - from));
      continue;
    }
    if (escaped) scratch += static_cast<char>(c);
    ++pos_;
  }
  ++pos_;
  return escaped ? std::string_view(scratch) : text_.substr(start, pos_ - 1 - start);
}

// At a backslash: appends what the escape stands for.
void JsonPull::append_escape(std::string& out) {
  if (pos_ + 1 >= text_.size()) fail_syntax("a string without its closing quote");
  const char c = text_[pos_ + 1];
  pos_ += 2;
  switch (c) {
    case '"': out += '"'; return;
    case '\\': out += '\\'; return;
    case '/': out += '/'; return;
    case 'b': out += '\b'; return;
    case 'f': out += '\f'; return;
    case 'n': out += '\n'; return;
    case 'r': out += '\r'; return;
    case 't': out += '\t'; return;
    case 'u': break;
    default: fail_syntax("an invalid escape, a backslash before " + printable(c));
  }
  auto code_unit = [&]() -> uint32_t {
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const int digit = pos_ < text_.size() ? hex_value(text_[pos_]) : -1;
      if (digit < 0) fail_syntax("\\u needs four hexadecimal digits");
      value = value * 16 + static_cast<uint32_t>(digit);
      ++pos_;
    }
    return value;
  };
  uint32_t code = code_unit();
  if (code >= 0xDC00 && code <= 0xDFFF) fail_syntax("a low surrogate without its high one");
  if (code >= 0xD800 && code <= 0xDBFF) {
    if (text_.substr(pos_, 2) != "\\u") fail_syntax("a high surrogate without its low one");
    pos_ += 2;
    const uint32_t low = code_unit();
    if (low < 0xDC00 || low > 0xDFFF) fail_syntax("a high surrogate without its low one");
    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
  }
  append_utf8(out, code);
}

// At a byte >= 0x80: one well-formed UTF-8 sequence (no overlong forms, surrogates or code points
// beyond U+10FFFF), as nlohmann's lexer requires.
void JsonPull::check_utf8_sequence() {
  const auto byte = [&](size_t i) { return pos_ + i < text_.size() ? static_cast<unsigned char>(text_[pos_ + i]) : 0; };
  const unsigned char lead = byte(0);
  unsigned char low = 0x80, high = 0xBF;
  size_t length = 0;
  if (lead >= 0xC2 && lead <= 0xDF) length = 2;
  else if (lead >= 0xE0 && lead <= 0xEF) length = 3, low = lead == 0xE0 ? 0xA0 : 0x80, high = lead == 0xED ? 0x9F : 0xBF;
  else if (lead >= 0xF0 && lead <= 0xF4) length = 4, low = lead == 0xF0 ? 0x90 : 0x80, high = lead == 0xF4 ? 0x8F : 0xBF;
  else fail_syntax("invalid UTF-8");
  for (size_t i = 1; i < length; ++i) {
    const unsigned char b = byte(i);
    if (b < (i == 1 ? low : 0x80) || b > (i == 1 ? high : 0xBF)) fail_syntax("invalid UTF-8");
  }
  pos_ += length;
}

// JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
std::string_view JsonPull::number_text() {
  const size_t start = pos_;
  auto digits = [&] {
    const size_t from = pos_;
    while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
    if (pos_ == from) fail_syntax("a malformed number");
  };
  if (text_[pos_] == '-') ++pos_;
  if (pos_ < text_.size() && text_[pos_] == '0') ++pos_;
  else digits();
  if (pos_ < text_.size() && text_[pos_] == '.') ++pos_, digits();
  if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    ++pos_;
    if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
    digits();
  }
  return text_.substr(start, pos_ - start);
}

JsonPull::Number JsonPull::read_number() {
  if (peek() != Kind::Number) fail_expected("a number");
  const size_t start = pos_;
  const std::string_view text = number_text();
  const char* begin = text.data();
  const char* end = begin + text.size();
  Number n{Number::Type::Signed};
  if (text.find_first_of(".eE") == std::string_view::npos) {
    if (std::from_chars(begin, end, n.signed_value).ec == std::errc()) return n;
    n.type = Number::Type::Unsigned;
    if (text[0] != '-' && std::from_chars(begin, end, n.unsigned_value).ec == std::errc()) return n;
  }
  n.type = Number::Type::Float;
  if (std::from_chars(begin, end, n.float_value).ec == std::errc() && std::isfinite(n.float_value)) return n;
  // Out of a double's range: too close to zero reads as zero, as nlohmann and Python read it (1e-400);
  // too large is refused (nlohmann would read infinity, which JSON has no number for).
  const size_t exponent = text.find_first_of("eE");
  if (exponent != std::string_view::npos && text.substr(exponent + 1, 1) == "-") {
    n.float_value = text[0] == '-' ? -0.0 : 0.0;
    return n;
  }
  fail(start, "a number beyond the range of a double: " + std::string(text.substr(0, 60)));
}

void JsonPull::skip_value() {
  std::string_view key;
  std::string scratch;
  switch (peek()) {
    case Kind::Object:
      begin_object();
      while (next_member(key)) skip_value();
      return;
    case Kind::Array:
      begin_array();
      while (next_element()) skip_value();
      return;
    case Kind::String: read_string_view(scratch); return;
    case Kind::Number: number_text(); return;
    case Kind::Boolean: read_bool(); return;
    case Kind::Null: read_null(); return;
  }
}

void JsonPull::finish() {
  skip_whitespace();
  if (pos_ != text_.size()) fail_syntax("text after the JSON value");
}

namespace {

bool is_container(JsonPull::Kind kind) { return kind == JsonPull::Kind::Object || kind == JsonPull::Kind::Array; }

// Walks the value `in` is at, recording in `steps` the way down to `target`; true once there.
bool walk_to(JsonPull& in, size_t target, std::vector<JsonPathStep>& steps) {
  const bool object = in.peek() == JsonPull::Kind::Object;
  if (object) in.begin_object();
  else in.begin_array();
  std::string_view key;
  for (size_t index = 0; object ? in.next_member(key) : in.next_element(); ++index) {
    const size_t at = in.offset();
    steps.push_back(object ? JsonPathStep{std::string(key), std::nullopt, at} : JsonPathStep{"", index, at});
    if (at == target) return true;
    if (at < target && is_container(in.peek())) {
      if (walk_to(in, target, steps)) return true;
    } else {
      in.skip_value();
    }
    steps.pop_back();
  }
  return false;
}

}  // namespace

std::vector<JsonPathStep> json_path_to(std::string_view text, size_t offset) {
  std::vector<JsonPathStep> steps;
  JsonPull in(text);
  try {
    if (in.offset() != offset && is_container(in.peek())) walk_to(in, offset, steps);
  } catch (const JsonPull::Problem&) {
    // The text goes wrong before the target: the steps so far say where.
  }
  return steps;
}

std::optional<size_t> json_member_offset(std::string_view text, size_t offset, std::string_view key) {
  JsonPull in(text, kMaxJsonDepth, offset);
  try {
    in.begin_object();
    std::string_view member;
    while (in.next_member(member)) {
      if (member == key) return in.offset();
      in.skip_value();
    }
  } catch (const JsonPull::Problem&) {
  }
  return std::nullopt;
}

std::optional<std::string> json_string_member(std::string_view text, size_t offset, std::string_view key) {
  const std::optional<size_t> at = json_member_offset(text, offset, key);
  JsonPull in(text, kMaxJsonDepth, at.value_or(0));
  std::string value;
  try {
    if (!at || in.peek() != JsonPull::Kind::String) return std::nullopt;
    in.read_string(value);
  } catch (const JsonPull::Problem&) {
    return std::nullopt;
  }
  return value;
}

}  // namespace dtensor::io
