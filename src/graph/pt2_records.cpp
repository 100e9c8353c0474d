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

// The field `path` (keys and indices) below `base`.
RecordField below(const RecordField& base, const std::vector<std::string>& path) {
  RecordField at = base;
  for (const std::string& token : path) at = at / token;
  return at;
}

// ---- step 1: floats where integers belong ------------------------------------------------------------------

// The schema's members of type double (F64, and lists of it): a float there may have any size. Anywhere
// else a float is read as an integer, which it must fit.
bool holds_a_double(const std::string& key) { return key == "as_float" || key == "real" || key == "imag"; }
bool holds_doubles(const std::string& key) { return key == "as_floats"; }

constexpr double kTwoTo63 = 9223372036854775808.0;

void refuse_floats(const Json& j, bool may_be_double, std::vector<std::string>& path, const RecordField& base) {
  if (j.is_number_float()) {
    if (may_be_double || std::fabs(j.get<double>()) < kTwoTo63) return;
    below(base, path).fail("expected an integer, found " + io::describe_json_value(j) + ", beyond any 64-bit integer");
  }
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      path.push_back(it.key());
      if (holds_doubles(it.key()) && it->is_array()) {
        for (size_t i = 0; i < it->size(); ++i) {
          path.push_back(std::to_string(i));
          refuse_floats((*it)[i], true, path, base);
          path.pop_back();
        }
      } else {
        refuse_floats(*it, holds_a_double(it.key()), path, base);
      }
      path.pop_back();
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      path.push_back(std::to_string(i));
      refuse_floats(j[i], false, path, base);
      path.pop_back();
    }
  }
}

// ---- step 3: the record against its decoded value written back ----------------------------------------

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

void compare(const Json& record, const Json& back, std::vector<std::string>& path, const RecordField& base) {
  auto fail_here = [&](const std::string& what) { below(base, path).fail(what); };
  if (record.is_object() && back.is_object()) {
    for (auto it = record.begin(); it != record.end(); ++it) {
      const auto written = back.find(it.key());
      if (written == back.end())
        fail_here("has the member '" + it.key().substr(0, 80) +
                  "', which torch 2.15's export schema does not have here (or a union with more than one member)");
      path.push_back(it.key());
      compare(*it, *written, path, base);
      path.pop_back();
    }
    return;
  }
  if (record.is_array() && back.is_array() && record.size() == back.size()) {
    for (size_t i = 0; i < record.size(); ++i) {
      path.push_back(std::to_string(i));
      compare(record[i], back[i], path, base);
      path.pop_back();
    }
    return;
  }
  // torch 2.15's generated F64 writer spells -inf "Infinity" (it tests isinf before the sign); its
  // reader reads "-Infinity" right.
  const bool minus_infinity = record == "-Infinity" && back == "Infinity";
  const bool same = minus_infinity || (record.is_number() && back.is_number() ? same_number(record, back) : record == back);
  if (!same)
    fail_here("holds " + io::describe_json_value(record) + ", which torch's export schema reads as " + io::describe_json_value(back));
}

}  // namespace

RecordField RecordField::operator/(const std::string& key) const {
  RecordField child = *this;
  child.path_.push_back(key);
  return child;
}

const Json* RecordField::find() const {
  const Json* at = root_;
  for (const std::string& token : path_)
    if (!(at = child_of(*at, token))) return nullptr;
  return at;
}

const Json& RecordField::json() const {
  const Json* at = find();
  if (!at) fail("the member is missing");
  return *at;
}

std::string RecordField::place() const {
  // Walk the record for the place's shape: a token into an array is an index.
  const Json* at = root_;
  std::string field;
  size_t first = 0;
  const std::vector<std::string> nodes = {"graph_module", "graph", "nodes"};
  std::string node;
  if (path_.size() >= 4 && std::equal(nodes.begin(), nodes.end(), path_.begin())) {
    const Json* n = root_;
    for (size_t i = 0; i < 4 && n; ++i) n = child_of(*n, path_[i]);
    const Json* name = n && n->is_object() && n->contains("name") ? &(*n)["name"] : nullptr;
    if (name && name->is_string() && !name->get_ref<const std::string&>().empty()) {
      node = "node '" + name->get_ref<const std::string&>().substr(0, 200) + "'";
      at = n;
      first = 4;
    }
  }
  for (size_t i = first; i < path_.size(); ++i) {
    const std::string& token = path_[i];
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
  std::vector<std::string> path;
  refuse_floats(field.json(), false, path, field);
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

void compare_with_record(const RecordField& field, const Json& written_back) {
  std::vector<std::string> path;
  compare(field.json(), written_back, path, field);
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
