#pragma once
// What graph transforms find about a program's values and nodes, held beside the graph rather than in
// it: the IR carries what the file says, a transform's findings are the transform's. They are:
//  - each tensor value's placements on the mesh (the marks the strategy choice makes, and the inputs'
//    placements the caller gives);
//  - once a program is partitioned (its values' metas made this rank's): each sharded value's global
//    meta, the whole tensor's, which planning a reshard needs;
//  - for a node a transform inserted or changed: why it is there (the printer shows it) and, for a
//    collective, the bytes this rank receives by the redistribution planner's model;
//  - for a node whose strategy needs dtensor's local kernel and that kernel has no graph form: the
//    kernel, which the interpreter runs instead of the op (such a program cannot be saved).
//
// Values and nodes are identified by their ids within one graph (Value::id, Node::id; a node's id is
// never reused after it is erased), so one Annotations belongs to one graph. Placements sit in an array
// indexed by value id: the strategy search reads and writes them millions of times on a deep model.

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dtensor/op_schema.h"
#include "dtensor/spec.h"

namespace dtensor::graph {

class Value;
class Node;

class Annotations {
 public:
  // nullptr where the value has none (not a tensor, or not marked yet).
  const Placements* placements(const Value& v) const;
  // The same, throwing DTensorError naming the value where it has none.
  const Placements& placements_of(const Value& v) const;
  void set_placements(const Value& v, Placements placements);
  void clear_placements(const Value& v);
  // "S(0)" style text, "" where the value has none.
  std::string placements_str(const Value& v) const;
  // nullptr where the value has none (not partitioned yet, or not a tensor).
  const TensorMeta* global_meta(const Value& v) const;
  const TensorMeta& global_meta_of(const Value& v) const;  // throwing DTensorError where none
  void set_global_meta(const Value& v, TensorMeta meta);

  const std::string& note(const Node& n) const;  // "" where none
  void set_note(const Node& n, std::string note);
  void append_note(const Node& n, const std::string& more);  // after the note there is, joined by "; "
  int64_t bytes_per_rank(const Node& n) const;               // 0 where none
  void set_bytes_per_rank(const Node& n, int64_t bytes);
  const LocalKernel* local_kernel(const Node& n) const;      // nullptr where none
  void set_local_kernel(const Node& n, LocalKernel kernel);

  // What a transform says of the whole program (a plan entry it skipped), in order; the program's text
  // starts with them.
  const std::vector<std::string>& program_notes() const { return program_notes_; }
  void add_program_note(std::string note) { program_notes_.push_back(std::move(note)); }

 private:
  struct NodeFacts {
    std::string note;
    int64_t bytes_per_rank = 0;
    LocalKernel local_kernel;
  };
  // A fact per value, by Value::id (dense).
  template <typename T>
  class ByValue {
   public:
    const T* find(size_t id) const { return id < facts_.size() && facts_[id] ? &*facts_[id] : nullptr; }
    void set(size_t id, T fact) {
      if (id >= facts_.size()) facts_.resize(id + 1);
      facts_[id] = std::move(fact);
    }
    void clear(size_t id) {
      if (id < facts_.size()) facts_[id].reset();
    }

   private:
    std::vector<std::optional<T>> facts_;
  };
  ByValue<Placements> placements_;
  ByValue<TensorMeta> global_metas_;
  std::vector<std::string> program_notes_;
  std::unordered_map<uint64_t, NodeFacts> nodes_;      // by Node::id
};

}  // namespace dtensor::graph
