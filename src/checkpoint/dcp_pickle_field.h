#pragma once
// A value of a restricted pickle's tree read by a schema (src/io/restricted_pickle.h), with its path
// from the root for errors: what the DCP readers (.metadata, dcp_metadata.cpp; a torch.save'd item's
// data.pkl, dcp_load.cpp) share.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../io/restricted_pickle.h"
#include "dtensor/errors.h"

namespace dtensor::checkpoint::dcp::detail {

using io::PickleKind;
using io::PickleRef;
using io::PickleTree;

inline std::string ints_str(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

inline std::string name_text(const std::string& name) { return "'" + name.substr(0, 200) + (name.size() > 200 ? "...'" : "'"); }

// A value of the tree with its path from the root, for errors: "<file>: field '<path>': <what> (byte N)".
// The path is kept as the parent's field and this one's step, and spelled out only for an error: a
// metadata file of 10^5 chunks makes a million fields. A field is read while its parent is alive (the
// reader walks down by schema), so the parent pointer never dangles.
class Field {
 public:
  Field(const PickleTree& tree, PickleRef ref, std::string root) : tree_(&tree), ref_(ref), step_(std::move(root)) {}
  Field(const Field& parent, PickleRef ref, std::string step)
      : tree_(parent.tree_), ref_(ref), parent_(&parent), step_(std::move(step)) {}

  const io::PickleValue& value() const { return tree_->at(ref_); }
  PickleRef ref() const { return ref_; }
  PickleKind kind() const { return value().kind; }
  std::string path() const { return parent_ ? parent_->path() + step_ : step_; }
  bool is_none() const { return kind() == PickleKind::None; }

  [[noreturn]] void fail(const std::string& what) const {
    throw DTensorError(tree_->source() + ": field '" + path() + "': " + what + " (byte " + std::to_string(value().offset) + ")");
  }
  [[noreturn]] void expected(const std::string& what) const { fail("expected " + what + ", found " + tree_->describe(ref_)); }

  Field child(PickleRef ref, std::string step) const { return Field(*this, ref, std::move(step)); }

  int64_t as_int(int64_t min = 0, int64_t max = INT64_MAX) const {
    if (kind() != PickleKind::Int) expected("an integer");
    if (value().integer < min || value().integer > max)
      fail("integer " + std::to_string(value().integer) + " is outside [" + std::to_string(min) + ", " + std::to_string(max) + "]");
    return value().integer;
  }
  bool as_bool() const {
    if (kind() != PickleKind::Bool) expected("True or False");
    return value().integer != 0;
  }
  const std::string& as_string() const {
    if (kind() != PickleKind::String) expected("a string");
    return value().text;
  }
  std::optional<std::string> as_optional_string() const {
    if (is_none()) return std::nullopt;
    return as_string();
  }
  // A tuple's or list's elements (either, where `sequence`; else a tuple only).
  std::vector<Field> elements(bool sequence = false) const {
    if (kind() != PickleKind::Tuple && !(sequence && kind() == PickleKind::List)) expected(sequence ? "a list or tuple" : "a tuple");
    return children("[", "]");
  }
  std::vector<Field> list() const {
    if (kind() != PickleKind::List) expected("a list");
    return children("[", "]");
  }
  // A dict's keys and values, in order (keys not checked here).
  std::vector<std::pair<Field, Field>> items() const {
    if (kind() != PickleKind::Dict) expected("a dict");
    std::vector<std::pair<Field, Field>> out;
    const auto& refs = value().items;
    for (size_t i = 0; i + 1 < refs.size(); i += 2)
      out.emplace_back(child(refs[i], "{key " + std::to_string(i / 2) + "}"), child(refs[i + 1], "[" + std::to_string(i / 2) + "]"));
    return out;
  }
  // A dict of string keys, each once: its members by name.
  // `keyed`: a dict of names (state_dict_metadata), its members' paths written ['name'], not .name.
  std::map<std::string, Field> members(bool keyed = false) const {
    std::map<std::string, Field> out;
    for (const auto& [key, value] : items()) {
      const std::string& name = key.as_string();
      if (!out.emplace(name, child(value.ref_, keyed ? "[" + name_text(name) + "]" : "." + name)).second) key.fail("the key " + name_text(name) + " appears twice");
    }
    return out;
  }
  // The state BUILD gave an object of class `cls` (a dataclass made by NEWOBJ); none when it had no BUILD.
  std::optional<Field> object_state(const std::string& cls) const {
    if (kind() != PickleKind::Object || value().reduced || value().text != cls) expected("a " + cls + " object");
    if (!value().state) return std::nullopt;
    return child(*value().state, "");
  }
  // The arguments REDUCE applied the callable `cls` to.
  std::vector<Field> reduced_args(const std::string& cls) const {
    if (kind() != PickleKind::Object || !value().reduced || value().text != cls) expected("a " + cls + " object");
    return children("(", ")");
  }
  // A torch.Size of non-negative ints.
  std::vector<int64_t> as_size() const {
    const std::vector<Field> args = reduced_args("torch.Size");
    if (args.size() != 1) fail("a torch.Size made from " + std::to_string(args.size()) + " arguments, not one tuple");
    std::vector<int64_t> out;
    for (const Field& d : args[0].elements()) out.push_back(d.as_int());
    return out;
  }

 private:
  std::vector<Field> children(const char* open, const char* close) const {
    std::vector<Field> out;
    const auto& refs = value().items;
    for (size_t i = 0; i < refs.size(); ++i) out.push_back(child(refs[i], open + std::to_string(i) + close));
    return out;
  }

  const PickleTree* tree_;
  PickleRef ref_;
  const Field* parent_ = nullptr;  // none at the root
  std::string step_;               // from the parent: ".name", "[3]", "['w']"
};

// A dtype global ("torch.float32").
inline c10::ScalarType dtype_of(const Field& f) {
  static const std::map<std::string, c10::ScalarType> dtypes = {
      {"torch.float64", c10::kDouble},     {"torch.float32", c10::kFloat},          {"torch.float16", c10::kHalf},
      {"torch.bfloat16", c10::kBFloat16},  {"torch.complex32", c10::kComplexHalf},  {"torch.complex64", c10::kComplexFloat},
      {"torch.complex128", c10::kComplexDouble}, {"torch.int64", c10::kLong},      {"torch.int32", c10::kInt},
      {"torch.int16", c10::kShort},        {"torch.int8", c10::kChar},              {"torch.uint64", c10::kUInt64},
      {"torch.uint32", c10::kUInt32},      {"torch.uint16", c10::kUInt16},          {"torch.uint8", c10::kByte},
      {"torch.bool", c10::kBool},          {"torch.float8_e4m3fn", c10::kFloat8_e4m3fn}, {"torch.float8_e5m2", c10::kFloat8_e5m2},
      {"torch.float8_e4m3fnuz", c10::kFloat8_e4m3fnuz}, {"torch.float8_e5m2fnuz", c10::kFloat8_e5m2fnuz}};
  const auto it = f.kind() == PickleKind::Global ? dtypes.find(f.value().text) : dtypes.end();
  if (it == dtypes.end()) f.expected("a torch dtype");
  return it->second;
}

}  // namespace dtensor::checkpoint::dcp::detail
