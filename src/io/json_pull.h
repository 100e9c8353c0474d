#pragma once
// A pull reader of untrusted JSON text: the caller asks for what it expects next (an object's
// members, an array's elements, a string, a number), and the reader checks the text as it goes,
// building no document. Typed decoders (the .pt2 records, src/graph/pt2_schema_decoder.cpp) read
// straight into their own values with it: a model.json of a 32-layer model is millions of values,
// and a document of them costs more to build and free than the decode itself.
//
// It refuses what parse_untrusted_json refuses: invalid JSON (with its byte offset), invalid UTF-8,
// nesting deeper than the limit, text after the value. A problem stops the read with
// JsonPull::Problem, which holds the byte offset of the value it concerns; the caller names that
// place (json_path_to finds the path to an offset) and throws its own error. Nothing is read twice
// on the way: only a problem rescans the text.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "untrusted_json.h"

namespace dtensor::io {

class JsonPull {
 public:
  // What stopped the read: `what` about the value at byte `offset` (for a missing member: the object
  // there, and `member` names the member).
  struct Problem {
    size_t offset;
    std::string member;
    std::string what;
  };

  enum class Kind { Null, Boolean, Number, String, Array, Object };

  // A number as the text spells it: an integer literal that fits int64 or uint64, else a double.
  struct Number {
    enum class Type { Signed, Unsigned, Float } type;
    int64_t signed_value = 0;
    uint64_t unsigned_value = 0;
    double float_value = 0;
  };

  // Reads `text` from byte `start` (a value inside it, for errors' second looks).
  explicit JsonPull(std::string_view text, int max_depth = kMaxJsonDepth, size_t start = 0) : text_(text), pos_(start), max_depth_(max_depth) {}

  // The kind of the next value, and the byte offset where it starts.
  Kind peek();
  size_t offset();

  // An object: begin_object, then next_member until it gives false. `key` is valid until the next
  // call (a view of the text, or of a scratch copy where the key has escapes).
  void begin_object();
  bool next_member(std::string_view& key);
  // An array: begin_array, then next_element until it gives false; each true is followed by one value.
  void begin_array();
  bool next_element();

  bool read_bool();
  void read_string(std::string& out);
  bool read_null();  // true (and consumes it) where the next value is null
  Number read_number();
  void skip_value();
  // After the document's value: only whitespace may follow.
  void finish();

  // Stops the read with a problem about the value at `at`.
  [[noreturn]] static void fail(size_t at, std::string what, std::string member = {});
  // "... found <a description of the value at `at`>": its kind and a short excerpt, or its size ("an
  // object of 3 members"). A syntax error inside the value is thrown instead, as the problem.
  std::string describe_at(size_t at) const;
  // `kind` for "expected an object, found ..." texts.
  [[noreturn]] void fail_expected(const char* expected);

 private:
  void skip_whitespace();
  [[noreturn]] void fail_syntax(const std::string& what) const;
  void expect(char c);
  void enter();
  bool next_entry(char close);
  std::string_view read_string_view(std::string& scratch);
  void append_escape(std::string& out);
  void check_utf8_sequence();
  std::string_view number_text();

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
  int max_depth_;
  std::vector<bool> first_;  // per open container: whether no member or element has been read yet
  std::string key_scratch_;
};

// One step of a path into a document: an object's key or an array's index, and where its value starts.
struct JsonPathStep {
  std::string key;
  std::optional<size_t> index;
  size_t value_offset = 0;
};

// The steps from the root of `text` (valid JSON up to `offset`) down to the value starting at
// `offset`; fewer where the text goes wrong before it. For errors only: it rescans the text.
std::vector<JsonPathStep> json_path_to(std::string_view text, size_t offset);

// Where the value of member `key` of the object starting at `offset` starts, if it has one; and that
// value, where it is a string. For errors only.
std::optional<size_t> json_member_offset(std::string_view text, size_t offset, std::string_view key);
std::optional<std::string> json_string_member(std::string_view text, size_t offset, std::string_view key);

}  // namespace dtensor::io
