#include "pt2_records.h"

#include <cctype>
#include <vector>

#include "dtensor/errors.h"

namespace dtensor::graph::detail {

std::string describe_place(const std::optional<std::string>& node, std::span<const PlaceToken> tokens) {
  std::string field;
  for (const PlaceToken& token : tokens) {
    if (token.index) field += "[" + std::to_string(*token.index) + "]";
    else field += (field.empty() ? "" : ".") + std::string(token.key.substr(0, 200));
  }
  const std::string named = node ? "node '" + node->substr(0, 200) + "'" : "";
  if (field.empty()) return named;
  return (named.empty() ? "" : named + ": ") + "field '" + field + "'";
}

RecordField RecordField::step(std::string key, size_t index, RecordStep::Kind kind) const {
  RecordField out = *this;
  steps_->push_back({step_, std::move(key), index, kind});
  out.step_ = &steps_->back();
  return out;
}

std::string RecordField::place() const {
  // Up to the root, or to the innermost named node: a place inside a node is named from it.
  std::vector<const RecordStep*> path;
  const RecordStep* node = nullptr;
  for (const RecordStep* s = step_; s && !node; s = s->parent) {
    if (s->kind == RecordStep::Kind::Node && !s->key.empty()) node = s;
    else path.push_back(s);
  }
  std::vector<PlaceToken> tokens;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    const RecordStep& s = **it;
    tokens.push_back(s.kind == RecordStep::Kind::Key ? PlaceToken{s.key, std::nullopt} : PlaceToken{{}, s.index});
  }
  return describe_place(node ? std::optional<std::string>(node->key) : std::nullopt, tokens);
}

void RecordField::fail(const std::string& what) const {
  const std::string where = place();
  throw DTensorError(*where_ + (where.empty() ? "" : ": " + where) + ": " + what);
}

std::string kind_name(std::string_view printed_tag) {
  std::string out(printed_tag);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace dtensor::graph::detail
