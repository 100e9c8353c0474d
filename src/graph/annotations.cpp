#include "dtensor/graph/annotations.h"

#include "dtensor/errors.h"
#include "dtensor/graph/ir.h"

namespace dtensor::graph {

const Placements* Annotations::placements(const Value& v) const { return placements_.find(v.id); }

const Placements& Annotations::placements_of(const Value& v) const {
  if (const Placements* p = placements(v)) return *p;
  throw DTensorError("graph: %" + v.name + " has no placements yet (a pass read it before any gave it some)");
}

void Annotations::set_placements(const Value& v, Placements placements) { placements_.set(v.id, std::move(placements)); }

void Annotations::clear_placements(const Value& v) { placements_.clear(v.id); }

std::string Annotations::placements_str(const Value& v) const {
  const Placements* p = placements(v);
  return p ? to_string(*p) : "";
}

const TensorMeta* Annotations::global_meta(const Value& v) const { return global_metas_.find(v.id); }

const TensorMeta& Annotations::global_meta_of(const Value& v) const {
  if (const TensorMeta* m = global_meta(v)) return *m;
  throw DTensorError("graph: %" + v.name + " has no global meta (partition gives one to every value it makes local)");
}

void Annotations::set_global_meta(const Value& v, TensorMeta meta) { global_metas_.set(v.id, std::move(meta)); }

const std::string& Annotations::note(const Node& n) const {
  static const std::string none;
  const auto it = nodes_.find(n.id);
  return it == nodes_.end() ? none : it->second.note;
}

void Annotations::set_note(const Node& n, std::string note) { nodes_[n.id].note = std::move(note); }

void Annotations::append_note(const Node& n, const std::string& more) {
  std::string& note = nodes_[n.id].note;
  note += (note.empty() ? "" : "; ") + more;
}

int64_t Annotations::bytes_per_rank(const Node& n) const {
  const auto it = nodes_.find(n.id);
  return it == nodes_.end() ? 0 : it->second.bytes_per_rank;
}

void Annotations::set_bytes_per_rank(const Node& n, int64_t bytes) { nodes_[n.id].bytes_per_rank = bytes; }

const LocalKernel* Annotations::local_kernel(const Node& n) const {
  const auto it = nodes_.find(n.id);
  return it == nodes_.end() || !it->second.local_kernel ? nullptr : &it->second.local_kernel;
}

void Annotations::set_local_kernel(const Node& n, LocalKernel kernel) { nodes_[n.id].local_kernel = std::move(kernel); }

}  // namespace dtensor::graph
