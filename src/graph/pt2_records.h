#pragma once
// The JSON records of a .pt2 (models/model.json, the weights and constants configs) are untrusted.
// They are decoded with torch's generated serialization types (generated_serialization_types.h, made
// from torch/_export/serde/schema.yaml), whose from_json is lenient: it gives absent members their
// defaults, converts numbers between types (16.5 reads as 16, true as 1, 2^64-1 as -1), takes the first
// member of a union it knows and leaves a union with none empty. So a record is read in three steps:
//  1. decode: a value of the wrong type is refused with its path (nlohmann's diagnostics, io/json.h);
//     before that, a float beyond int64 anywhere but where the schema holds a double (turning it into
//     an integer would be undefined behaviour).
//  2. round trip: the decoded value, written back, must hold every member of the record with the
//     same value. What differs is a member the schema does not have, a second member of a union, or a
//     value changed on the way in.
//  3. the reader checks meaning on the decoded value (pt2_graph_reader.cpp, pt2_reader.cpp), naming
//     what it refuses through RecordField, and asks require_member of every union it reads.
// read_record runs the three.

#include <string>
#include <variant>
#include <vector>

#include "../io/json.h"  // first: it sets up nlohmann for the generated types
#include <torch/csrc/utils/generated_serialization_types.h>

#include "../io/untrusted_json.h"

namespace dtensor::graph::detail {

// A place in a record, for errors: "<file>: <record>: node 'addmm': field 'inputs[1].arg'" inside
// models/model.json's nodes, "<file>: <record>: field 'config.fc1.weight.path_name'" elsewhere. A view
// of the record, which must outlive it. It holds the value it names, not its path: a step down is one
// lookup, and the path is found again (a search of the record) only to name it in an error.
class RecordField {
 public:
  // The record's root; `where` names it ("gpt.pt2: models/model.json").
  RecordField(const io::Json& root, const std::string& where) : root_(&root), where_(&where), value_(&root) {}

  RecordField operator/(const std::string& key) const;
  RecordField operator/(size_t index) const;

  // Whether the record has this member: an absent one decodes to its default.
  bool present() const { return value_ != nullptr; }
  // The record's value here (present() must hold).
  const io::Json& json() const;

  // "<where>: <place>: <what>", or "...: the member is missing" where the record lacks this member.
  [[noreturn]] void fail(const std::string& what) const;
  // "node 'addmm': field 'inputs[1].arg'", "field 'graph_module.signature'", or "" at the root.
  std::string place() const;
  // The record's root, with the same `where`.
  RecordField root() const { return RecordField(*root_, *where_); }
  // The field holding `value`, a value of this record (what a walk of the record found).
  RecordField holding(const io::Json& value) const;

 private:
  RecordField absent(std::string token) const;

  const io::Json* root_;
  const std::string* where_;
  const io::Json* value_;              // nullptr where the record lacks the member
  const io::Json* present_ = nullptr;  // where value_ is nullptr: the last present value on the way,
  std::vector<std::string> missing_;   // and the keys and indices below it
};

// Step 1 for the value at `field`.
void refuse_floats_beyond_integers(const RecordField& field);
[[noreturn]] void fail_decoding(const RecordField& field, const io::Json::exception& error);

template <class T>
T decode(const RecordField& field) {
  if (!field.present()) field.fail("the member is missing");
  refuse_floats_beyond_integers(field);
  try {
    return field.json().get<T>();
  } catch (const io::Json::exception& error) {
    fail_decoding(field, error);
  }
}

// Step 2: `written_back` is the decoded value as to_json writes it.
void compare_with_record(const RecordField& field, const io::Json& written_back);

// Step 2 for `decoded`. false, having compared nothing, when a union in it has no member: such a value
// cannot be written back.
template <class T>
bool round_trips(const RecordField& field, const T& decoded) {
  io::Json written_back;
  try {
    written_back = decoded;
  } catch (const std::bad_variant_access&) {
    return false;
  }
  compare_with_record(field, written_back);
  return true;
}

// Step 2 for a graph, in pieces: each node and each tensor meta written back and compared on its own,
// then the rest. Written back whole, the graph of a 32-layer model is one tree of millions of values,
// built, compared and freed out of cache: four times the time of the same work in pieces.
bool round_trips(const RecordField& field, const torch::_export::Graph& graph);

// The three steps for the record part at `field`, decoded as T and handed to `read` (step 3). The
// round trip runs before `read`, so that its checks see only values the file really holds; where it
// cannot (a union with no member), `read` names the union through require_member, and one it does not
// read is refused after.
template <class T, class Read>
void read_record(const RecordField& field, Read&& read) {
  const T decoded = decode<T>(field);
  const bool compared = round_trips(field, decoded);
  read(decoded);
  if (!compared) field.fail("a union in it has none of the members torch's export schema allows");
}

[[noreturn]] void fail_empty_union(const RecordField& field);

template <class Union>
void require_member(const Union& value, const RecordField& field) {
  if (value.tag() != typename Union::Tag{}) return;
  try {
    io::Json probe = value;  // cheap: the first kind of every union is a small one
  } catch (const std::bad_variant_access&) {
    fail_empty_union(field);
  }
}

// The lower-case name of a union's kind, as the record spells it ("as_sym_bool").
std::string kind_name(std::string_view printed_tag);

}  // namespace dtensor::graph::detail
