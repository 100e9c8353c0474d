#include "untrusted_json.h"

#include "dtensor/errors.h"

namespace dtensor::io {
namespace {

// A DOM builder for nlohmann's SAX parser (what its json_sax_dom_parser does), with a depth limit and
// duplicate keys refused: a key is known twice from its insertion into the object, so no key is copied
// or kept aside, and keys and strings move into the document. The first problem stops the parse (a
// handler returning false) and is kept as the error.
class LimitedDomBuilder {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  LimitedDomBuilder(Json& root, int max_depth) : root_(root), max_depth_(max_depth) {}

  bool null() {
    add(nullptr);
    return true;
  }
  bool boolean(bool value) {
    add(value);
    return true;
  }
  bool number_integer(number_integer_t value) {
    add(value);
    return true;
  }
  bool number_unsigned(number_unsigned_t value) {
    add(value);
    return true;
  }
  bool number_float(number_float_t value, const string_t&) {
    add(value);
    return true;
  }
  bool string(string_t& value) {
    add(std::move(value));
    return true;
  }
  bool binary(binary_t&) {
    error_ = "binary data";  // JSON text has none; nlohmann's binary formats do
    return false;
  }
  bool start_object(std::size_t) { return enter(Json::value_t::object); }
  bool start_array(std::size_t) { return enter(Json::value_t::array); }
  bool end_object() {
    open_.pop_back();
    return true;
  }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  bool key(string_t& key) {
    const auto [member, inserted] = open_.back()->emplace(std::move(key), nullptr);
    if (!inserted) {
      error_ = "an object holds the key '" + member.key().substr(0, 80) + "' twice";
      return false;
    }
    member_ = &member.value();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    const std::string what = e.what();
    // nlohmann's text: "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ...".
    const auto colon = what.find(": ");
    error_ = "invalid JSON at byte " + std::to_string(position) + " (" + (colon == std::string::npos ? what : what.substr(colon + 2)) + ")";
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  // Where `value` went: the root, the end of the open array, or the open object's member just keyed.
  template <class Value>
  Json* add(Value&& value) {
    if (open_.empty()) {
      root_ = Json(std::forward<Value>(value));
      return &root_;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(Json(std::forward<Value>(value)));
      return &parent.back();
    }
    *member_ = Json(std::forward<Value>(value));
    return member_;
  }
  bool enter(Json::value_t type) {
    if (open_.size() >= static_cast<size_t>(max_depth_)) {
      error_ = "JSON nested deeper than " + std::to_string(max_depth_) + " levels";
      return false;
    }
    open_.push_back(add(type));
    return true;
  }

  Json& root_;
  int max_depth_;
  std::vector<Json*> open_;  // the objects and arrays open, outermost first
  Json* member_ = nullptr;   // the open object's member being read
  std::string error_;
};

const char* type_name(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a fractional number";
    default: return "a value of another kind";
  }
}

}  // namespace

Json parse_untrusted_json(std::string_view text, const std::string& source, int max_depth) {
  Json root;
  LimitedDomBuilder parser(root, max_depth);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &parser, nlohmann::detail::input_format_t::json, true);
  if (!ok || !parser.error().empty())
    throw DTensorError(source + ": " + (parser.error().empty() ? std::string("invalid JSON") : parser.error()) +
                       ": the file is corrupted");
  return root;
}

JsonField JsonField::at(const std::string& key) const {
  if (!value_->is_object()) fail("expected an object with the member '" + key + "', found " + found());
  const auto it = value_->find(key);
  if (it == value_->end()) child(*value_, child_path(key)).fail("the member is missing");
  return child(*it, child_path(key));
}

std::optional<JsonField> JsonField::find(const std::string& key) const {
  if (!value_->is_object()) fail("expected an object, found " + found());
  const auto it = value_->find(key);
  if (it == value_->end()) return std::nullopt;
  return child(*it, child_path(key));
}

std::vector<JsonField> JsonField::elements() const {
  if (!value_->is_array()) fail("expected an array, found " + found());
  std::vector<JsonField> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i) out.push_back(child((*value_)[i], path_ + "[" + std::to_string(i) + "]"));
  return out;
}

std::vector<std::pair<std::string, JsonField>> JsonField::members() const {
  if (!value_->is_object()) fail("expected an object, found " + found());
  std::vector<std::pair<std::string, JsonField>> out;
  out.reserve(value_->size());
  for (auto it = value_->begin(); it != value_->end(); ++it) out.emplace_back(it.key(), child(it.value(), child_path(it.key())));
  return out;
}

std::pair<std::string, JsonField> JsonField::only_member() const {
  if (!value_->is_object() || value_->size() != 1) fail("expected an object with exactly one member (a union), found " + found());
  const auto it = value_->begin();
  return {it.key(), child(it.value(), child_path(it.key()))};
}

int64_t JsonField::as_int(int64_t min, int64_t max) const {
  int64_t v = 0;
  if (value_->is_number_unsigned()) {
    const uint64_t u = value_->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) fail("expected an integer below 2^63, found " + found());
    v = static_cast<int64_t>(u);
  } else if (value_->is_number_integer()) {
    v = value_->get<int64_t>();
  } else {
    fail("expected an integer, found " + found());
  }
  if (v < min || v > max)
    fail("expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], found " + std::to_string(v));
  return v;
}

std::vector<int64_t> JsonField::as_ints(int64_t min, int64_t max) const {
  std::vector<int64_t> out;
  for (const JsonField& e : elements()) out.push_back(e.as_int(min, max));
  return out;
}

double JsonField::as_number() const {
  if (!value_->is_number()) fail("expected a number, found " + found());
  return value_->get<double>();
}

bool JsonField::as_bool() const {
  if (!value_->is_boolean()) fail("expected true or false, found " + found());
  return value_->get<bool>();
}

const std::string& JsonField::as_string() const {
  if (!value_->is_string()) fail("expected a string, found " + found());
  return value_->get_ref<const std::string&>();
}

void JsonField::fail(const std::string& what) const {
  throw DTensorError(*where_ + (path_.empty() ? "" : ": field '" + path_ + "'") + ": " + what);
}

std::string describe_json_value(const Json& value) {
  std::string out = type_name(value);
  if (value.is_primitive() && !value.is_null()) {
    std::string text = value.dump();  // a primitive: bounded by the document's size, never recursive
    if (text.size() > 60) text = text.substr(0, 60) + "...";
    out += " " + text;
  } else if (value.is_structured()) {
    out += " of " + std::to_string(value.size()) + (value.is_object() ? " members" : " elements");
  }
  return out;
}

}  // namespace dtensor::io
