#include "untrusted_json.h"

#include <unordered_set>

#include "dtensor/errors.h"

namespace dtensor::io {
namespace {

// The keys one object has had so far: a short list for the many small objects, a hash set once an
// object grows large (a safetensors header, tensor_values), so the check stays linear.
class KeySet {
 public:
  void clear() {
    few_.clear();
    many_.clear();
  }
  // false when `key` was there already.
  bool insert(const std::string& key) {
    if (!many_.empty()) return many_.insert(key).second;
    for (const std::string& k : few_)
      if (k == key) return false;
    few_.push_back(key);
    if (few_.size() > 16) {
      many_.insert(few_.begin(), few_.end());
      few_.clear();
    }
    return true;
  }

 private:
  std::vector<std::string> few_;
  std::unordered_set<std::string> many_;
};

// nlohmann's DOM builder with a depth limit and duplicate keys refused. The first problem stops the
// parse (a handler returning false) and is kept as the error.
class LimitedDomParser : public nlohmann::detail::json_sax_dom_parser<Json> {
  using Base = nlohmann::detail::json_sax_dom_parser<Json>;

 public:
  LimitedDomParser(Json& root, int max_depth) : Base(root, false), max_depth_(max_depth) {}

  bool start_object(std::size_t n) {
    if (!enter()) return false;
    if (keys_.size() < static_cast<size_t>(depth_)) keys_.resize(static_cast<size_t>(depth_));
    keys_[static_cast<size_t>(depth_ - 1)].clear();
    return Base::start_object(n);
  }
  bool end_object() {
    --depth_;
    return Base::end_object();
  }
  bool start_array(std::size_t n) { return enter() && Base::start_array(n); }
  bool end_array() {
    --depth_;
    return Base::end_array();
  }
  bool key(std::string& key) {
    if (!keys_[static_cast<size_t>(depth_ - 1)].insert(key)) {
      error_ = "an object holds the key '" + key.substr(0, 80) + "' twice";
      return false;
    }
    return Base::key(key);
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
  bool enter() {
    if (++depth_ <= max_depth_) return true;
    error_ = "JSON nested deeper than " + std::to_string(max_depth_) + " levels";
    return false;
  }

  int max_depth_;
  int depth_ = 0;
  std::vector<KeySet> keys_;  // one per open object, by depth (kept to reuse their memory)
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
  LimitedDomParser parser(root, max_depth);
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
