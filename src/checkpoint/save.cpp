#include <ATen/ATen.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <set>

#include "../io/json.h"
#include "dtensor/api.h"
#include "dtensor/checkpoint.h"
#include "dtensor/errors.h"
#include "dtensor/pieces.h"
#include "dtensor/world.h"
#include "dtypes.h"
#include "durable_file.h"
#include "format.h"
#include "job.h"

namespace dtensor::checkpoint {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using detail::Job;

// One tensor of the state as it will be saved.
struct Saved {
  std::string name;
  std::string dtype;
  Shape global_shape;
  std::vector<Piece> pieces;  // writer: holders[0]
  at::Tensor local;           // this rank's data (a DTensor's shard, reduced if Partial; a plain tensor)
};

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
    s.dtype = detail::safetensors_dtype(tensor.scalar_type(), name);
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

// A rank is the first holder of at most one piece of a tensor: its own shard.
bool writes(const Piece& p, int rank) { return p.holders.front() == rank; }

// Rank 0: the directory exists and holds no checkpoint (or, with overwrite, no longer does: the commit
// marker goes first, so a crash from here on leaves a directory that is refused).
void prepare_directory(const fs::path& dir, bool overwrite) {
  fs::create_directories(dir);
  std::vector<fs::path> old;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == detail::kCommitFile || name == detail::kIndexFile || entry.path().extension() == ".safetensors" ||
        (name.front() == '.' && entry.path().extension() == ".tmp"))
      old.push_back(entry.path());
  }
  if (old.empty()) return;
  if (!overwrite)
    throw DTensorError("checkpoint::save: " + dir.string() + " already holds a checkpoint (" +
                       old.front().filename().string() + ", ...); save into a new directory or pass overwrite");
  if (fs::exists(dir / detail::kCommitFile)) {
    fs::remove(dir / detail::kCommitFile);
    detail::sync_directory(dir.string());  // gone for good before any new file appears
  }
  // Old files that come back after a crash do no harm: without a marker the directory is refused.
  for (const auto& path : old) fs::remove(path);
}

// For the crash tests: DTENSOR_CHECKPOINT_FAULT=kill-after-write:R kills rank R (SIGKILL) right after its
// file is written, before the ranks agree and the commit marker is written.
void maybe_die_after_write(int rank) {
  const char* fault = std::getenv("DTENSOR_CHECKPOINT_FAULT");
  const std::string prefix = "kill-after-write:";
  if (fault && std::string(fault).rfind(prefix, 0) == 0 && std::stoi(std::string(fault).substr(prefix.size())) == rank)
    std::raise(SIGKILL);
}

int64_t write_rank_file(const std::vector<Saved>& saved, const Job& job, const fs::path& path) {
  std::vector<detail::TensorToWrite> tensors;
  json offsets = json::object(), global_shapes = json::object();
  std::vector<at::Tensor> keep_alive;
  for (const Saved& s : saved)
    for (const Piece& p : s.pieces) {
      if (!writes(p, job.rank)) continue;
      at::Tensor data = p.box.empty() ? at::empty(p.box.shape, s.local.options()) : s.local;
      data = data.to(at::kCPU).resolve_conj().resolve_neg().contiguous();  // the values, not a lazy view's bits
      keep_alive.push_back(data);
      tensors.push_back({s.name, s.dtype, p.box.shape, data.data_ptr()});
      offsets[s.name] = {{"saved_offsets", p.box.offset}};
      global_shapes[s.name] = s.global_shape;
    }
  if (tensors.empty()) return 0;
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {detail::kDcpVersionKey, "1.0"},
      {detail::kDcpShardingKey, offsets.dump()},
      {detail::kDtensorKey, json{{"version", detail::kFormatVersion}, {"global_shapes", global_shapes}}.dump()}};
  return detail::write_safetensors(path.string(), tensors, metadata);
}

// The Hugging Face index (with dtensor's list of files and tensors, and for a node-local save the host
// that wrote each file), written with the files: pure layout math says what every rank writes. Without
// the commit marker it counts for nothing.
void write_index(const std::vector<Saved>& saved, const Job& job, const std::vector<std::string>& hosts, const fs::path& dir) {
  json weight_map = json::object(), tensors = json::object();
  std::set<std::string> files;
  int64_t total = 0;
  for (const Saved& s : saved) {
    for (const Piece& p : s.pieces) {
      const std::string file = detail::rank_file_name(static_cast<int>(p.holders.front()), job.size);
      files.insert(file);
      // Hugging Face's loaders take a weight_map entry for the whole tensor: only tensors saved whole get one.
      if (s.pieces.size() == 1 && p.box.shape == s.global_shape) weight_map[s.name] = file;
      total += numel(p.box.shape) * detail::safetensors_element_size(s.dtype);
    }
    tensors[s.name] = {{"dtype", s.dtype}, {"global_shape", s.global_shape}};
  }
  json section = {{"version", detail::kFormatVersion}, {"world_size", job.size}, {"files", files}, {"tensors", tensors}};
  if (!hosts.empty()) {
    json nodes = json::object();
    for (int r = 0; r < job.size; ++r)
      if (files.count(detail::rank_file_name(r, job.size))) nodes[detail::rank_file_name(r, job.size)] = hosts[static_cast<size_t>(r)];
    section[detail::kNodesKey] = nodes;
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}, {detail::kDtensorKey, section}};
  detail::write_durably((dir / detail::kIndexFile).string(), index.dump(2));
}

// Rank 0, once every rank's file is fsync'd and renamed: those renames made durable, then the commit
// marker, made durable too.
void commit(const fs::path& dir) {
  detail::sync_directory(dir.string());
  detail::write_durably((dir / detail::kCommitFile).string(), json{{"version", detail::kFormatVersion}}.dump() + "\n");
  detail::sync_directory(dir.string());
}

// What a save holds once its collectives are done: every piece this rank writes, in memory of its
// own when `staged` (so that the state may change while the files are written).
struct Prepared {
  Job job;
  std::vector<Saved> saved;
  // Whether this rank prepares the directory and writes the index and the commit marker: rank 0, or in
  // a node-local save the first rank of each host, so that every node's directory has its own.
  bool leads_directory = false;
  std::vector<std::string> hosts;  // a node-local save's: every rank's host
};

Prepared prepare(const State& state, const SaveOptions& options, bool staged) {
  Prepared out{Job::of(state, options.world, "save"), {}};
  const Job& job = out.job;
  std::string fingerprint;
  std::exception_ptr error;
  try {
    out.saved = plan(state, job, options.whole_tensors, fingerprint);
    fingerprint += options.whole_tensors ? "whole" : "shards";
  } catch (...) {
    error = std::current_exception();
  }
  job.agree(error, "planning the save");
  job.check_same(fingerprint + (options.node_local ? "node-local" : ""), "save");
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

// The files, the index and the commit marker, each step agreed on by every rank: no collectives, so it
// may run on a thread of its own.
SaveResult write(const Prepared& prepared, const fs::path& dir, bool overwrite) {
  const Job& job = prepared.job;
  std::exception_ptr error;
  if (prepared.leads_directory) try {
      prepare_directory(dir, overwrite);
    } catch (...) {
      error = std::current_exception();
    }
  job.agree(error, "preparing " + dir.string());

  SaveResult result;
  error = nullptr;
  try {
    const std::string file = detail::rank_file_name(job.rank, job.size);
    result.bytes_written = write_rank_file(prepared.saved, job, dir / file);
    if (result.bytes_written > 0) result.file = (dir / file).string();
    if (prepared.leads_directory) write_index(prepared.saved, job, prepared.hosts, dir);
  } catch (...) {
    error = std::current_exception();
  }
  maybe_die_after_write(job.rank);
  job.agree(error, "writing " + dir.string());

  error = nullptr;
  if (prepared.leads_directory) try {
      commit(dir);
    } catch (...) {
      error = std::current_exception();
    }
  job.agree(error, "committing " + dir.string());
  return result;
}

}  // namespace

SaveResult save(const State& state, const std::string& dir, const SaveOptions& options) {
  return write(prepare(state, options, /*staged=*/false), fs::path(dir), options.overwrite);
}

std::future<SaveResult> save_async(const State& state, const std::string& dir, const SaveOptions& options) {
  auto prepared = std::make_shared<Prepared>(prepare(state, options, /*staged=*/true));
  prepared->job.channel = "async-save";
  return std::async(std::launch::async, [prepared, path = fs::path(dir), overwrite = options.overwrite] {
    return write(*prepared, path, overwrite);
  });
}

bool is_committed(const std::string& dir) { return fs::exists(fs::path(dir) / detail::kCommitFile); }

}  // namespace dtensor::checkpoint
