#include "pt2_records.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string_view>

#include "dtensor/errors.h"

namespace dtensor::graph::detail {
namespace {

using io::Json;

// An index into an array, as a path token ("3"); nullopt for anything else.
std::optional<size_t> array_index(const std::string& token, const Json& array) {
  if (token.empty() || token.size() > 18 || !std::all_of(token.begin(), token.end(), [](char c) { return std::isdigit(c); }))
    return std::nullopt;
  const size_t i = std::stoull(token);
  return i < array.size() ? std::optional<size_t>(i) : std::nullopt;
}

const Json* child_of(const Json& parent, const std::string& token) {
  if (parent.is_object()) {
    const auto it = parent.find(token);
    return it == parent.end() ? nullptr : &*it;
  }
  if (parent.is_array())
    if (const auto i = array_index(token, parent)) return &parent[*i];
  return nullptr;
}

// The keys and indices from `from` down to `target`, a value inside it; false where it is not there.
// Only errors search (RecordField::place); the parse limits the depth (io::kMaxJsonDepth).
bool path_to(const Json& from, const Json* target, std::vector<std::string>& path) {
  if (&from == target) return true;
  if (from.is_object()) {
    for (const auto& [key, value] : from.get_ref<const Json::object_t&>()) {
      path.push_back(key);
      if (path_to(value, target, path)) return true;
      path.pop_back();
    }
  } else if (from.is_array()) {
    for (size_t i = 0; i < from.size(); ++i) {
      path.push_back(std::to_string(i));
      if (path_to(from[i], target, path)) return true;
      path.pop_back();
    }
  }
  return false;
}

// ---- step 1: floats where integers belong ------------------------------------------------------------------

// The schema's members of type double (F64, and lists of it): a float there may have any size. Anywhere
// else a float is read as an integer, which it must fit.
bool holds_a_double(const std::string& key) { return key == "as_float" || key == "real" || key == "imag"; }
bool holds_doubles(const std::string& key) { return key == "as_floats"; }

constexpr double kTwoTo63 = 9223372036854775808.0;

// The first float in `j` that no 64-bit integer holds where one belongs, or nullptr.
const Json* float_beyond_integers(const Json& j, bool may_be_double) {
  if (j.is_number_float()) return may_be_double || std::fabs(j.get<double>()) < kTwoTo63 ? nullptr : &j;
  if (j.is_object()) {
    for (const auto& [key, value] : j.get_ref<const Json::object_t&>()) {
      if (holds_doubles(key) && value.is_array()) {
        for (const Json& element : value.get_ref<const Json::array_t&>())
          if (const Json* found = float_beyond_integers(element, true)) return found;
      } else if (const Json* found = float_beyond_integers(value, holds_a_double(key))) {
        return found;
      }
    }
  } else if (j.is_array()) {
    for (const Json& element : j.get_ref<const Json::array_t&>())
      if (const Json* found = float_beyond_integers(element, false)) return found;
  }
  return nullptr;
}

// ---- step 2: the record against its decoded value written back ----------------------------------------

// The same number, whatever JSON type holds it (a double field written as 2 reads back as 2.0).
bool same_number(const Json& a, const Json& b) {
  auto integer = [](const Json& x) -> __int128 {
    return x.is_number_unsigned() ? static_cast<__int128>(x.get<uint64_t>()) : static_cast<__int128>(x.get<int64_t>());
  };
  if (a.is_number_float() && b.is_number_float()) return a.get<double>() == b.get<double>();
  if (!a.is_number_float() && !b.is_number_float()) return integer(a) == integer(b);
  const Json& f = a.is_number_float() ? a : b;
  const Json& i = a.is_number_float() ? b : a;
  const double d = f.get<double>();
  return std::floor(d) == d && std::fabs(d) < kTwoTo63 && static_cast<__int128>(d) == integer(i);
}

void compare(const Json& record, const Json& back, const RecordField& field);

// The members of two objects, but for those `compared_apart` (piece by piece, by the caller).
void compare_members(const Json& record, const Json& back, const RecordField& field,
                     std::initializer_list<std::string_view> compared_apart = {}) {
  // Both objects keep their members sorted by key: one pass over each pairs them.
  const Json::object_t& written = back.get_ref<const Json::object_t&>();
  auto w = written.begin();
  for (const auto& [key, value] : record.get_ref<const Json::object_t&>()) {
    if (std::find(compared_apart.begin(), compared_apart.end(), key) != compared_apart.end()) continue;
    while (w != written.end() && w->first < key) ++w;
    if (w == written.end() || w->first != key)
      field.holding(record).fail("has the member '" + key.substr(0, 80) +
                                 "', which torch 2.15's export schema does not have here (or a union with more than one member)");
    compare(value, w->second, field);
    ++w;
  }
}

// `record` is a value of the record at `field`; what goes wrong is named by field.holding.
void compare(const Json& record, const Json& back, const RecordField& field) {
  if (record.is_object() && back.is_object()) return compare_members(record, back, field);
  if (record.is_array() && back.is_array() && record.size() == back.size()) {
    for (size_t i = 0; i < record.size(); ++i) compare(record[i], back[i], field);
    return;
  }
  // torch 2.15's generated F64 writer spells -inf "Infinity" (it tests isinf before the sign); its
  // reader reads "-Infinity" right.
  const bool minus_infinity = record == "-Infinity" && back == "Infinity";
  const bool same = minus_infinity || (record.is_number() && back.is_number() ? same_number(record, back) : record == back);
  if (!same)
    field.holding(record).fail("holds " + io::describe_json_value(record) + ", which torch's export schema reads as " +
                               io::describe_json_value(back));
}

}  // namespace

RecordField RecordField::operator/(const std::string& key) const {
  if (!value_) return absent(key);
  const Json* child = child_of(*value_, key);
  if (!child) return absent(key);
  RecordField out(*root_, *where_);
  out.value_ = child;
  return out;
}

RecordField RecordField::operator/(size_t index) const {
  if (!value_ || !value_->is_array() || index >= value_->size()) return *this / std::to_string(index);
  RecordField out(*root_, *where_);
  out.value_ = &(*value_)[index];
  return out;
}

RecordField RecordField::absent(std::string token) const {
  RecordField out = *this;
  if (value_) out.present_ = value_;
  out.value_ = nullptr;
  out.missing_.push_back(std::move(token));
  return out;
}

RecordField RecordField::holding(const Json& value) const {
  RecordField out(*root_, *where_);
  out.value_ = &value;
  return out;
}

const Json& RecordField::json() const {
  if (!value_) fail("the member is missing");
  return *value_;
}

std::string RecordField::place() const {
  std::vector<std::string> path;
  path_to(*root_, value_ ? value_ : present_, path);
  path.insert(path.end(), missing_.begin(), missing_.end());
  // Walk the record for the place's shape: a token into an array is an index.
  const Json* at = root_;
  std::string field;
  size_t first = 0;
  const std::vector<std::string> nodes = {"graph_module", "graph", "nodes"};
  std::string node;
  if (path.size() >= 4 && std::equal(nodes.begin(), nodes.end(), path.begin())) {
    const Json* n = root_;
    for (size_t i = 0; i < 4 && n; ++i) n = child_of(*n, path[i]);
    const Json* name = n && n->is_object() && n->contains("name") ? &(*n)["name"] : nullptr;
    if (name && name->is_string() && !name->get_ref<const std::string&>().empty()) {
      node = "node '" + name->get_ref<const std::string&>().substr(0, 200) + "'";
      at = n;
      first = 4;
    }
  }
  for (size_t i = first; i < path.size(); ++i) {
    const std::string& token = path[i];
    const bool index = at && at->is_array() && array_index(token, *at);
    field += index ? "[" + token + "]" : (field.empty() ? "" : ".") + token.substr(0, 200);
    at = at ? child_of(*at, token) : nullptr;
  }
  if (field.empty()) return node;
  return (node.empty() ? "" : node + ": ") + "field '" + field + "'";
}

void RecordField::fail(const std::string& what) const {
  const std::string where = place();
  throw DTensorError(*where_ + (where.empty() ? "" : ": " + where) + ": " + (present() ? what : "the member is missing"));
}

void refuse_floats_beyond_integers(const RecordField& field) {
  if (const Json* found = float_beyond_integers(field.json(), false))
    field.holding(*found).fail("expected an integer, found " + io::describe_json_value(*found) + ", beyond any 64-bit integer");
}

void fail_decoding(const RecordField& field, const Json::exception& error) {
  // With diagnostics nlohmann's text is "[json.exception.type_error.302] (/graph_module/...) type must be
  // string, but is number": the pointer, from the record's root, then what went wrong.
  const std::string what = error.what();
  std::string text = what.substr(std::min(what.size(), what.find("] ") + 2));
  RecordField at = field;
  if (text.rfind("(/", 0) == 0 && text.find(") ") != std::string::npos) {
    const std::string pointer = text.substr(1, text.find(") ") - 1);
    text = text.substr(pointer.size() + 3);
    at = field.root();
    for (size_t start = 1; start <= pointer.size();) {
      const size_t end = std::min(pointer.find('/', start), pointer.size());
      std::string token;  // unescaped: "~1" is '/', "~0" is '~'
      for (size_t k = start; k < end; ++k) {
        const bool escape = pointer[k] == '~' && k + 1 < end;
        token += escape ? (pointer[k + 1] == '1' ? '/' : '~') : pointer[k];
        k += escape;
      }
      at = at / token;
      start = end + 1;
    }
  }
  at.fail("does not fit torch's export schema (" + text + ")" + (at.present() ? ": found " + io::describe_json_value(at.json()) : ""));
}

void compare_with_record(const RecordField& field, const Json& written_back) { compare(field.json(), written_back, field); }

bool round_trips(const RecordField& field, const torch::_export::Graph& graph) {
  const RecordField nodes = field / "nodes", tensor_values = field / "tensor_values";
  for (size_t i = 0; i < graph.get_nodes().size(); ++i)
    if (!round_trips(nodes / i, graph.get_nodes()[i])) return false;
  for (const auto& [name, meta] : graph.get_tensor_values())
    if (!round_trips(tensor_values / name, meta)) return false;
  // The rest, small: a graph holding all but the nodes and tensor metas, whose written-back (empty)
  // members are left out of the compare. A member torch adds to Graph is not copied here, so a record
  // holding it is refused (written back as its default), not read past.
  torch::_export::Graph rest;
  rest.set_inputs(graph.get_inputs());
  rest.set_outputs(graph.get_outputs());
  rest.set_sym_int_values(graph.get_sym_int_values());
  rest.set_sym_bool_values(graph.get_sym_bool_values());
  rest.set_is_single_tensor_return(graph.get_is_single_tensor_return());
  rest.set_custom_obj_values(graph.get_custom_obj_values());
  rest.set_sym_float_values(graph.get_sym_float_values());
  Json written_back;
  try {
    written_back = rest;
  } catch (const std::bad_variant_access&) {
    return false;
  }
  if (!field.json().is_object()) compare_with_record(field, written_back);  // refused: not a graph
  compare_members(field.json(), written_back, field, {"nodes", "tensor_values"});
  return true;
}

void fail_empty_union(const RecordField& field) {
  if (!field.present()) field.fail("");
  const Json& j = field.json();
  field.fail(j.is_object() && !j.empty()
                 ? "none of its members ('" + j.begin().key().substr(0, 40) + "', ...) is one torch's export schema allows here"
                 : "expected an object with one member (a union), found " + io::describe_json_value(j));
}

std::string kind_name(std::string_view printed_tag) {
  std::string out(printed_tag);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace dtensor::graph::detail
