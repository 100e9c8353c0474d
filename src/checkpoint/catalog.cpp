// The catalog of a checkpoint directory. Every file in it is untrusted: the index and each file's
// __metadata__ are parsed with limits and read field by field (io::JsonField), and the pieces of each
// tensor must tile its global shape exactly (no overlap, no gap), or nothing loads.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "../io/checked_int.h"
#include "../io/untrusted_json.h"
#include "dtensor/errors.h"
#include "dtensor/spec.h"
#include "format.h"

namespace dtensor::checkpoint::detail {
namespace {

using io::JsonField;
namespace fs = std::filesystem;

constexpr int64_t kMaxIndexBytes = int64_t{100} << 20;

io::Json read_json(const fs::path& path) {
  std::error_code error;
  const auto size = fs::file_size(path, error);
  if (error) throw DTensorError("checkpoint: cannot read " + path.string() + ": " + error.message());
  if (size > static_cast<uint64_t>(kMaxIndexBytes))
    throw DTensorError("checkpoint: " + path.string() + " holds " + std::to_string(size) + " bytes, more than an index can: the index is corrupted");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw DTensorError("checkpoint: cannot read " + path.string());
  return io::parse_untrusted_json(text.str(), "checkpoint: " + path.string());
}

// A file an index names must lie in the checkpoint's directory.
std::string checked_file_name(const JsonField& field) {
  const std::string& name = field.as_string();
  const fs::path p(name);
  if (name.empty() || p.is_absolute() || p.has_parent_path() || name == "." || name == "..")
    field.fail("'" + name.substr(0, 200) + "' is not a file of this directory: the index is corrupted");
  return name;
}

// The saved_offsets DCP records for each tensor of a file: every tensor has its entry, and every entry
// is a tensor of the file.
std::map<std::string, Shape> dcp_offsets(const SafetensorsFile& file, const std::string& text) {
  const std::string where = "checkpoint: " + file.path() + ": __metadata__ " + kDcpShardingKey;
  const io::Json info = io::parse_untrusted_json(text, where);
  std::map<std::string, Shape> out;
  for (const auto& [name, entry] : JsonField(info, where).members()) out[name] = entry.at("saved_offsets").as_ints(0);
  for (const StoredTensor& t : file.tensors())
    if (!out.count(t.name)) throw DTensorError(where + ": tensor '" + t.name + "' has no saved_offsets");
  return out;
}

// The global shapes dtensor records for the tensors of a file.
std::map<std::string, Shape> dtensor_global_shapes(const SafetensorsFile& file, const std::string& text) {
  const std::string where = "checkpoint: " + file.path() + ": __metadata__ " + kDtensorKey;
  const io::Json meta = io::parse_untrusted_json(text, where);
  const JsonField root(meta, where);
  const int64_t version = root.at("version").as_int();
  if (version < 1 || version > kFormatVersion)
    root.at("version").fail("format version " + std::to_string(version) + " is not one this dtensor reads (1 to " +
                            std::to_string(kFormatVersion) + ")");
  std::map<std::string, Shape> out;
  for (const auto& [name, shape] : root.at("global_shapes").members()) out[name] = shape.as_ints(0);
  return out;
}

// Whether two boxes of the same rank share an element (empty boxes share none).
bool overlap(const Box& a, const Box& b) { return !a.empty() && !b.empty() && intersect(a, b).has_value(); }

}  // namespace

std::string rank_file_name(int rank, int world_size) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", rank + 1, world_size);
  return name;
}

// The files to read: a dtensor checkpoint's own list, a Hugging Face index's weight map, or every
// *.safetensors file in the directory (a single save_file, or DCP's sharded output). Only those present
// with PresentOnly, which takes an absent directory for one holding nothing.
std::vector<std::string> Catalog::files_of(const fs::path& dir, Files files) {
  const bool present_only = files == Files::PresentOnly;
  if (!fs::is_directory(dir)) {
    if (present_only && !fs::exists(dir)) return {};
    throw DTensorError("checkpoint: " + dir.string() + " is not a directory");
  }
  const auto here = [&](std::set<std::string> names) {
    listed_.assign(names.begin(), names.end());
    if (present_only) std::erase_if(names, [&](const std::string& name) { return !fs::exists(dir / name); });
    return std::vector<std::string>(names.begin(), names.end());
  };
  const fs::path index = dir / kIndexFile;
  const bool committed = fs::exists(dir / kCommitFile);
  std::set<std::string> names;
  if (fs::exists(index)) {
    const io::Json j = read_json(index);
    const std::string where = "checkpoint: " + index.string();
    const JsonField root(j, where);
    if (!j.is_object()) root.fail("expected a JSON object, found " + root.found() + ": the index is corrupted");
    if (root.has(kDtensorKey)) {
      if (!committed)
        throw DTensorError("checkpoint: " + dir.string() + " has no commit marker (" + kCommitFile +
                           "): its save did not finish; load an earlier checkpoint");
      const JsonField section = root.at(kDtensorKey);
      for (const JsonField& f : section.at("files").elements()) names.insert(checked_file_name(f));
      if (section.has(kNodesKey))
        for (const auto& [file, host] : section.at(kNodesKey).members()) file_hosts_[file] = host.as_string();
      return here(names);
    }
    if (root.has("weight_map")) {
      for (const auto& [tensor, file] : root.at("weight_map").members()) {
        names.insert(checked_file_name(file));
        weight_map_[tensor] = file.as_string();
      }
      return here(names);
    }
  }
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") names.insert(entry.path().filename().string());
  if (names.empty() && !present_only)
    throw DTensorError("checkpoint: " + dir.string() + " holds no checkpoint (no *.safetensors files)");
  return {names.begin(), names.end()};  // no index: nothing listed
}

void Catalog::add_pieces(const SafetensorsFile& file, bool committed, const fs::path& dir) {
  const auto& meta = file.metadata();
  std::map<std::string, Shape> offsets, global_shapes;
  if (const auto it = meta.find(kDcpShardingKey); it != meta.end()) offsets = dcp_offsets(file, it->second);
  if (const auto it = meta.find(kDtensorKey); it != meta.end()) {
    if (!committed)
      throw DTensorError("checkpoint: " + file.path() + " comes from a save that did not finish (" + dir.string() +
                         " has no commit marker " + kCommitFile + "); load an earlier checkpoint");
    global_shapes = dtensor_global_shapes(file, it->second);
  }
  std::set<std::string> in_file;
  for (const StoredTensor& t : file.tensors()) in_file.insert(t.name);
  for (const auto& named : {&offsets, &global_shapes})
    for (const auto& [name, shape] : *named)
      if (!in_file.count(name))
        throw DTensorError("checkpoint: " + file.path() + ": its __metadata__ describes tensor '" + name + "', which the file does not hold");

  for (const StoredTensor& t : file.tensors()) {
    DescribedPiece d{t.name, t.dtype, SavedPiece{file.path(), &file, Box{Shape(t.shape.size(), 0), t.shape}, t.begin}, std::nullopt};
    if (const auto it = offsets.find(t.name); it != offsets.end()) d.piece.box.offset = it->second;
    if (d.piece.box.offset.size() != t.shape.size())
      throw DTensorError("checkpoint: " + file.path() + ": tensor '" + t.name + "' has saved_offsets " +
                         shape_str(d.piece.box.offset) + " for its shape " + shape_str(t.shape) + ": the file is corrupted");
    if (const auto it = global_shapes.find(t.name); it != global_shapes.end()) d.global_shape = it->second;
    add(d);
  }
}

void Catalog::add(const DescribedPiece& d) {
  SavedTensor& saved = tensors_[d.tensor];
  const std::string& file = d.piece.file;
  if (!saved.pieces.empty() && saved.dtype != d.dtype)
    throw DTensorError("checkpoint: tensor '" + d.tensor + "' is " + saved.dtype + " in " + saved.pieces.front().file + " but " +
                       d.dtype + " in " + file);
  if (!saved.pieces.empty() && saved.pieces.front().box.shape.size() != d.piece.box.shape.size())
    throw DTensorError("checkpoint: tensor '" + d.tensor + "' has " + std::to_string(saved.pieces.front().box.shape.size()) +
                       " dims in " + saved.pieces.front().file + " but " + std::to_string(d.piece.box.shape.size()) + " in " + file);
  saved.dtype = d.dtype;
  if (d.global_shape) {
    if (!saved.shape_recorded_in.empty() && saved.global_shape != *d.global_shape)
      throw DTensorError("checkpoint: tensor '" + d.tensor + "' has global shape " + shape_str(saved.global_shape) + " in " +
                         saved.shape_recorded_in + " but " + shape_str(*d.global_shape) + " in " + file + ": the files disagree");
    saved.global_shape = *d.global_shape;
    saved.shape_recorded_in = file;
  }
  saved.pieces.push_back(d.piece);
  described_.push_back(d);
}

// The global shape is where the pieces end (DCP's rule), unless dtensor recorded it (uneven shards past
// the end are not saved); the pieces must then tile it: each inside it, none overlapping another, and
// together as many elements as it has.
void Catalog::check_tiling(const std::string& name, SavedTensor& saved) const {
  const size_t ndim = saved.pieces.front().box.shape.size();
  if (saved.shape_recorded_in.empty()) {
    saved.global_shape = Shape(ndim, 0);
    for (const SavedPiece& p : saved.pieces)
      for (size_t d = 0; d < ndim; ++d) {
        const auto end = io::checked_add(p.box.offset[d], p.box.shape[d]);
        if (!end) throw DTensorError("checkpoint: tensor '" + name + "': the piece in " + p.file + " lies beyond any tensor");
        saved.global_shape[d] = std::max(saved.global_shape[d], *end);
      }
  }
  const auto total = io::checked_numel(saved.global_shape);
  if (saved.global_shape.size() != ndim || !total)
    throw DTensorError("checkpoint: " + dir_ + ": tensor '" + name + "' has global shape " + shape_str(saved.global_shape) +
                       " for pieces of " + std::to_string(ndim) + " dims: the checkpoint is corrupted");
  std::optional<int64_t> held = 0;  // nullopt past int64: then they overlap, which the sweep reports
  for (const SavedPiece& p : saved.pieces) {
    bool fits = true;
    for (size_t d = 0; d < ndim && fits; ++d) {
      const auto end = io::checked_add(p.box.offset[d], p.box.shape[d]);
      fits = end && *end <= saved.global_shape[d];
    }
    if (!fits)
      throw DTensorError("checkpoint: tensor '" + name + "': the piece in " + p.file + " at " + shape_str(p.box.offset) +
                         " of shape " + shape_str(p.box.shape) + " does not fit its global shape " + shape_str(saved.global_shape));
    if (held) held = io::checked_add(*held, *io::checked_numel(p.box.shape));  // a piece inside the shape has fewer elements
  }
  // Overlaps, by a sweep along the dim whose piece offsets differ most.
  std::vector<const SavedPiece*> order;
  for (const SavedPiece& p : saved.pieces) order.push_back(&p);
  size_t sweep = 0, most = 0;
  for (size_t d = 0; d < ndim; ++d) {
    std::set<int64_t> starts;
    for (const SavedPiece* p : order) starts.insert(p->box.offset[d]);
    if (starts.size() > most) most = starts.size(), sweep = d;
  }
  const auto start = [&](const SavedPiece* p) { return ndim ? p->box.offset[sweep] : 0; };
  const auto end = [&](const SavedPiece* p) { return ndim ? p->box.offset[sweep] + p->box.shape[sweep] : 1; };
  std::sort(order.begin(), order.end(), [&](const SavedPiece* a, const SavedPiece* b) { return start(a) < start(b); });
  for (size_t i = 0; i < order.size(); ++i)
    for (size_t j = i + 1; j < order.size() && start(order[j]) < end(order[i]); ++j)
      if (overlap(order[i]->box, order[j]->box))
        throw DTensorError("checkpoint: tensor '" + name + "': the pieces in " + order[i]->file + " at " +
                           shape_str(order[i]->box.offset) + " and in " + order[j]->file + " at " +
                           shape_str(order[j]->box.offset) + " overlap: the checkpoint is corrupted");
  if (held != total)  // disjoint pieces inside the shape: fewer elements than it has
    throw DTensorError("checkpoint: " + dir_ + ": tensor '" + name + "' of global shape " + shape_str(saved.global_shape) +
                       ": the saved pieces hold " + std::to_string(*held) + " of its " + std::to_string(*total) +
                       " elements: a file of the checkpoint is missing");
}

Catalog::Catalog(const std::string& dir_name, Files files) : dir_(dir_name) {
  const fs::path dir(dir_name);
  const bool committed = fs::exists(dir / kCommitFile);
  for (const std::string& name : files_of(dir, files)) {
    files_.push_back(std::make_unique<SafetensorsFile>((dir / name).string()));
    add_pieces(*files_.back(), committed, dir);
  }
  if (files == Files::All) check_complete();
}

Catalog::Catalog(std::string dir, const std::vector<DescribedPiece>& pieces) : dir_(std::move(dir)) {
  for (const DescribedPiece& d : pieces) add(d);
  check_complete();
}

void Catalog::check_complete() {
  for (auto& [name, saved] : tensors_) check_tiling(name, saved);
  // A Hugging Face index says which file holds each tensor: it must be so.
  for (const auto& entry : weight_map_) {
    const auto it = tensors_.find(entry.first);
    const bool there = it != tensors_.end() && std::any_of(it->second.pieces.begin(), it->second.pieces.end(), [&](const SavedPiece& p) {
                         return fs::path(p.file).filename() == entry.second;
                       });
    if (!there)
      throw DTensorError("checkpoint: " + (fs::path(dir_) / kIndexFile).string() + ": weight_map puts tensor '" + entry.first +
                         "' in " + entry.second + ", which does not hold it: the index is corrupted");
  }
}

const SafetensorsFile* Catalog::file_named(const std::string& name) const {
  for (const auto& file : files_)
    if (fs::path(file->path()).filename() == name) return file.get();
  return nullptr;
}

}  // namespace dtensor::checkpoint::detail
