#pragma once
// Places in a .pt2's JSON records, for the errors of the readers' checks of meaning
// (pt2_graph_reader.cpp, pt2_reader.cpp), which run on the values decoded from them (pt2_decoding.h):
// "<where>: node 'addmm': field 'inputs[1].arg': <what>" inside models/model.json's nodes,
// "<where>: field 'config.fc1.weight.path_name': <what>" elsewhere.

#include <cstddef>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace dtensor::graph::detail {

// One step of a place: an object's key or an array's index.
struct PlaceToken {
  std::string_view key;
  std::optional<size_t> index;
};

// "node 'addmm': field 'inputs[1].arg'" (the tokens below the node), "field 'graph_module.signature'"
// (no node), "node 'addmm'", or "" (the record's root).
std::string describe_place(const std::optional<std::string>& node, std::span<const PlaceToken> tokens);

// The steps of the places a reader names, kept for as long as it reads: a step down is one append
// to a deque (addresses stay put), and the path is spelled out only when a check fails.
struct RecordStep {
  const RecordStep* parent;
  std::string key;  // a key, or a node's name
  size_t index;
  enum class Kind : unsigned char { Key, Index, Node } kind;
};
using RecordSteps = std::deque<RecordStep>;

class RecordScope;

// A place in a record. A view: `steps` and `where` must outlive it.
class RecordField {
 public:
  // The record's root; `where` names it ("gpt.pt2: models/model.json").
  RecordField(RecordSteps& steps, const std::string& where) : steps_(&steps), where_(&where) {}

  RecordField operator/(std::string_view key) const { return step(std::string(key), 0, RecordStep::Kind::Key); }
  RecordField operator/(size_t index) const { return step({}, index, RecordStep::Kind::Index); }
  // Element `index` of the graph's nodes, named by the node's `name` where it has one.
  RecordField node(size_t index, const std::string& name) const { return step(name, index, RecordStep::Kind::Node); }

  // "<where>: <place>: <what>".
  [[noreturn]] void fail(const std::string& what) const;

 private:
  friend class RecordScope;
  RecordField step(std::string key, size_t index, RecordStep::Kind kind) const;
  std::string place() const;

  RecordSteps* steps_;
  const std::string* where_;
  const RecordStep* step_ = nullptr;  // nullptr at the root
};

// Drops, when it ends, the steps made while it lived: a reader names places per node or per tensor
// meta, and none of those fields outlives the node's reading. Without it the steps of a whole record
// would pile up (several times the record's size).
class RecordScope {
 public:
  explicit RecordScope(const RecordField& field) : steps_(field.steps_), mark_(field.steps_->size()) {}
  ~RecordScope() { steps_->resize(mark_); }
  RecordScope(const RecordScope&) = delete;
  RecordScope& operator=(const RecordScope&) = delete;

 private:
  RecordSteps* steps_;
  size_t mark_;
};

// The lower-case name of a union's kind, as the record spells it ("as_sym_bool").
std::string kind_name(std::string_view printed_tag);

}  // namespace dtensor::graph::detail
