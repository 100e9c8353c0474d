#include "save_plan.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <set>

#include "dtensor/api.h"
#include "dtensor/errors.h"
#include "dtensor/world.h"
#include "../io/json.h"
#include "dtypes.h"

namespace dtensor::checkpoint::detail {
namespace {

// The rank that writes tensor number `index` whole: one of its mesh's ranks (so the gather's bridge
// is the mesh's own group), or for a plain tensor one of the world's, in turn.
int64_t whole_writer(const at::Tensor& tensor, size_t index, const Job& job) {
  if (!is_dtensor(tensor)) return static_cast<int64_t>(index % static_cast<size_t>(job.size));
  const auto& ranks = mesh_of(tensor)->ranks();
  return ranks[index % ranks.size()];
}

std::vector<Saved> plan(const State& state, const Job& job, bool whole_tensors, std::string& fingerprint) {
  std::vector<Saved> out;
  for (const auto& [name, tensor] : state) {
    if (name == "__metadata__")
      throw DTensorError("checkpoint::save: '__metadata__' is the safetensors header's own key; rename that tensor");
    Saved s;
    s.name = name;
    s.dtype = safetensors_dtype(tensor.scalar_type(), name);
    s.scalar_type = tensor.scalar_type();
    s.global_shape = tensor.sizes().vec();
    fingerprint += name + ":" + s.dtype + ":" + shape_str(s.global_shape);
    if (is_dtensor(tensor)) {
      const DTensorSpec& spec = spec_of(tensor);
      const Placements placements = partial_as_replicate(spec.placements);
      s.pieces = pieces_of(s.global_shape, spec.mesh->shape(), spec.mesh->ranks(), placements);
      fingerprint += ":" + spec.mesh->str() + ":" + to_string(spec.placements);
    } else {
      const Box whole{Shape(s.global_shape.size(), 0), s.global_shape};
      if (!whole.empty()) s.pieces.push_back(Piece{whole, {0}});
    }
    if (whole_tensors) s.pieces = {Piece{Box{Shape(s.global_shape.size(), 0), s.global_shape}, {whole_writer(tensor, out.size(), job)}}};
    // A tensor with no elements is still recorded, as one empty piece from rank 0.
    if (s.pieces.empty()) s.pieces.push_back(Piece{Box{Shape(s.global_shape.size(), 0), s.global_shape}, {0}});
    fingerprint += ";";
    out.push_back(std::move(s));
  }
  return out;
}

// A tensor as a partitioned save tells the other ranks of it: its layout ("plain", or a DTensor's mesh
// and placements) and its pieces.
nlohmann::json describe(const Saved& s, const at::Tensor& tensor) {
  nlohmann::json pieces = nlohmann::json::array();
  for (const Piece& p : s.pieces) pieces.push_back({p.box.offset, p.box.shape, p.holders});
  const std::string layout = is_dtensor(tensor) ? mesh_of(tensor)->str() + " " + to_string(placements_of(tensor)) : "plain";
  return {{"name", s.name}, {"dtype", s.dtype}, {"shape", s.global_shape}, {"layout", layout}, {"pieces", pieces}};
}

Saved described(const nlohmann::json& d) {
  Saved s;
  s.name = d.at("name").get<std::string>();
  s.dtype = d.at("dtype").get<std::string>();
  s.scalar_type = scalar_type_of(s.dtype, s.name, "a partitioned save");
  s.global_shape = d.at("shape").get<Shape>();
  for (const auto& p : d.at("pieces")) s.pieces.push_back(Piece{Box{p.at(0).get<Shape>(), p.at(1).get<Shape>()}, p.at(2).get<std::vector<int64_t>>()});
  return s;
}

// Refuses a DTensor piece whose writer did not pass the tensor: every rank of its mesh must save it
// (the writer would have no data, and a Partial one's reduction would wait for it).
void require_holders_listed(const Saved& s, const std::set<int64_t>& listed_by) {
  for (const Piece& p : s.pieces)
    for (const int64_t holder : p.holders)
      if (!listed_by.count(holder))
        throw DTensorError("checkpoint::save (partitioned): rank " + std::to_string(holder) + " holds a shard of '" + s.name +
                           "' but did not pass it; every rank of a DTensor's mesh must save it");
}

// A partitioned save's plan: every rank's tensors (gathered from what each planned for its own), in
// the order of their names. A tensor several ranks hold is the first one's: a plain one (or one with no
// elements) is written by it; the others must describe it the same.
std::vector<Saved> merge_partitions(std::vector<Saved> mine, const State& state, const Job& job) {
  nlohmann::json own = nlohmann::json::array();
  for (Saved& s : mine) {
    const at::Tensor& tensor = state.at(s.name);
    if (!is_dtensor(tensor) || tensor.numel() == 0) s.pieces = {Piece{Box{Shape(s.global_shape.size(), 0), s.global_shape}, {job.rank}}};
    own.push_back(describe(s, tensor));
  }
  const std::vector<std::string> all = job.gather(own.dump());
  std::map<std::string, std::pair<int, nlohmann::json>> first;  // name -> (rank, its description)
  std::map<std::string, std::set<int64_t>> listed_by;
  std::map<std::string, Saved> merged;
  for (int rank = 0; rank < job.size; ++rank)
    for (nlohmann::json& d : nlohmann::json::parse(all[static_cast<size_t>(rank)])) {
      const std::string name = d.at("name").get<std::string>();
      listed_by[name].insert(rank);
      const auto [it, inserted] = first.emplace(name, std::make_pair(rank, d));
      if (inserted) {
        merged.emplace(name, described(d));
        continue;
      }
      const nlohmann::json& other = it->second.second;
      for (const char* key : {"dtype", "shape", "layout"})
        if (d.at(key) != other.at(key))
          throw DTensorError("checkpoint::save (partitioned): ranks " + std::to_string(it->second.first) + " and " + std::to_string(rank) +
                             " both hold '" + name + "' but with " + key + " " + other.at(key).dump() + " and " + d.at(key).dump() +
                             "; a tensor held by several ranks must be the same tensor on each");
    }
  std::vector<Saved> out;
  for (auto& [name, s] : merged) {
    require_holders_listed(s, listed_by.at(name));
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

Prepared prepare(const State& state, const SaveOptions& options, bool staged) {
  check_partitioned(options.partitioned, options.node_local, options.world, "save");
  Prepared out{Job::of(state, options.world, "save"), {}};
  const Job& job = out.job;
  std::string fingerprint;
  std::exception_ptr error;
  try {
    if (options.partitioned && options.whole_tensors)
      throw DTensorError("checkpoint::save: a partitioned save writes each rank's tensors as they are; it cannot also write them whole");
    out.saved = plan(state, job, options.whole_tensors, fingerprint);
    fingerprint += options.whole_tensors ? "whole" : "shards";
  } catch (...) {
    error = std::current_exception();
  }
  job.agree(error, "planning the save");
  const std::string mode = std::string(options.node_local ? "node-local" : "") + (options.partitioned ? "partitioned" : "");
  if (options.partitioned) {
    job.check_same(mode, "save");
    // Every rank gathers the same descriptions, so a disagreement throws on every rank alike.
    out.saved = merge_partitions(std::move(out.saved), state, job);
  } else {
    job.check_same(fingerprint + mode, "save");
  }
  out.leads_directory = job.rank == 0;
  if (options.node_local) {
    out.hosts = job.gather(host_name());
    const auto first = std::find(out.hosts.begin(), out.hosts.end(), out.hosts[static_cast<size_t>(job.rank)]);
    out.leads_directory = first - out.hosts.begin() == job.rank;
  }

  // Partial shards are reduced first, or whole tensors gathered on their writers: collectives every
  // rank runs in the same order.
  std::map<int64_t, MeshPtr> writer_meshes;  // a mesh of one rank per writer, made in the order of use
  for (Saved& s : out.saved) {
    if (!state.count(s.name)) continue;  // another rank's (partitioned)
    const at::Tensor& tensor = state.at(s.name);
    at::Tensor placed = tensor.detach();
    if (is_dtensor(tensor)) {
      const DTensorSpec& spec = spec_of(tensor);
      if (options.whole_tensors) {
        const int64_t writer = s.pieces.front().holders.front();
        MeshPtr& one = writer_meshes[writer];
        if (!one) one = DeviceMesh::create(job.world, {1}, {writer}, MeshOptions{{}, spec.mesh->device_type(), spec.mesh->timeout()});
        placed = redistribute(placed, one, {Replicate()});
      } else if (spec.has_partial()) {
        placed = redistribute(placed, partial_as_replicate(spec.placements));
      }
      placed = local_tensor_of(placed);
    }
    const bool written_here = std::any_of(s.pieces.begin(), s.pieces.end(), [&](const Piece& p) { return writes(p, job.rank); });
    if (staged && written_here) placed = placed.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    s.local = placed;
  }
  return out;
}


}  // namespace dtensor::checkpoint::detail
