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
#include "save_plan.h"

namespace dtensor::checkpoint {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using detail::Job;
using detail::Prepared;
using detail::Saved;
using detail::writes;

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
  return write(detail::prepare(state, options, /*staged=*/false), fs::path(dir), options.overwrite);
}

std::future<SaveResult> save_async(const State& state, const std::string& dir, const SaveOptions& options) {
  auto prepared = std::make_shared<Prepared>(detail::prepare(state, options, /*staged=*/true));
  prepared->job.channel = "async-save";
  return std::async(std::launch::async, [prepared, path = fs::path(dir), overwrite = options.overwrite] {
    return write(*prepared, path, overwrite);
  });
}

bool is_committed(const std::string& dir) { return fs::exists(fs::path(dir) / detail::kCommitFile); }

}  // namespace dtensor::checkpoint
