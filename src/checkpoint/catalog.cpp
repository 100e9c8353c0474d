#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "dtensor/errors.h"
#include "format.h"

namespace dtensor::checkpoint::detail {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw DTensorError("checkpoint: cannot read " + path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw DTensorError("checkpoint: " + path.string() + " is not valid JSON (" + e.what() + "): the file is corrupted");
  }
}

std::string shape_text(const Shape& shape) { return json(shape).dump(); }

// A file an index names must lie in the checkpoint's directory.
std::string checked_file_name(const fs::path& dir, const std::string& name) {
  const fs::path p(name);
  if (name.empty() || p.is_absolute() || p.has_parent_path())
    throw DTensorError("checkpoint: " + (dir / kIndexFile).string() + " names the file '" + name +
                       "', which is not a file of that directory: the index is corrupted");
  return name;
}

// The files to read: a dtensor checkpoint's own list, a Hugging Face index's weight map, or every
// *.safetensors file in the directory (a single save_file, or DCP's sharded output).
std::vector<std::string> files_of(const fs::path& dir) {
  if (!fs::is_directory(dir)) throw DTensorError("checkpoint: " + dir.string() + " is not a directory");
  const fs::path index = dir / kIndexFile;
  const bool committed = fs::exists(dir / kCommitFile);
  std::set<std::string> names;
  if (fs::exists(index)) try {
    const json j = read_json(index);
    if (j.contains(kDtensorKey)) {
      if (!committed)
        throw DTensorError("checkpoint: " + dir.string() + " has no commit marker (" + kCommitFile +
                           "): its save did not finish; load an earlier checkpoint");
      for (const auto& f : j.at(kDtensorKey).at("files")) names.insert(checked_file_name(dir, f.get<std::string>()));
      return {names.begin(), names.end()};
    }
    if (j.contains("weight_map")) {
      for (const auto& [tensor, file] : j.at("weight_map").items()) names.insert(checked_file_name(dir, file.get<std::string>()));
      return {names.begin(), names.end()};
    }
  } catch (const json::exception& e) {
    throw DTensorError("checkpoint: " + index.string() + " is malformed (" + e.what() + "): the index is corrupted");
  }
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") names.insert(entry.path().filename().string());
  if (names.empty()) throw DTensorError("checkpoint: " + dir.string() + " holds no checkpoint (no *.safetensors files)");
  return {names.begin(), names.end()};
}

}  // namespace

std::string rank_file_name(int rank, int world_size) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", rank + 1, world_size);
  return name;
}

void Catalog::add_pieces(const SafetensorsFile& file, bool committed, const fs::path& dir) {
  const auto& meta = file.metadata();
  json offsets_by_name, dtensor_meta;
  if (const auto it = meta.find(kDcpShardingKey); it != meta.end()) offsets_by_name = json::parse(it->second, nullptr, false);
  if (const auto it = meta.find(kDtensorKey); it != meta.end()) {
    if (!committed)
      throw DTensorError("checkpoint: " + file.path() + " comes from a save that did not finish (" + dir.string() +
                         " has no commit marker " + kCommitFile + "); load an earlier checkpoint");
    dtensor_meta = json::parse(it->second, nullptr, false);
  }
  if (offsets_by_name.is_discarded() || dtensor_meta.is_discarded())
    throw DTensorError("checkpoint: " + file.path() + ": its __metadata__ is not valid JSON: the file is corrupted");
  for (const StoredTensor& t : file.tensors()) {
    SavedPiece piece{&file, Box{Shape(t.shape.size(), 0), t.shape}, t.begin};
    if (offsets_by_name.contains(t.name)) piece.box.offset = offsets_by_name[t.name].at("saved_offsets").get<Shape>();
    if (piece.box.offset.size() != t.shape.size())
      throw DTensorError("checkpoint: " + file.path() + ": tensor '" + t.name + "' has saved_offsets of the wrong length");
    SavedTensor& saved = tensors_[t.name];
    if (!saved.pieces.empty() && saved.dtype != t.dtype)
      throw DTensorError("checkpoint: tensor '" + t.name + "' is " + saved.dtype + " in " +
                         saved.pieces.front().file->path() + " but " + t.dtype + " in " + file.path());
    if (saved.pieces.empty()) saved.global_shape = Shape(t.shape.size(), 0);
    saved.dtype = t.dtype;
    // The global shape is where the pieces end (DCP's rule), unless dtensor recorded it (uneven
    // shards past the end are not saved).
    for (size_t d = 0; d < t.shape.size() && d < saved.global_shape.size(); ++d)
      saved.global_shape[d] = std::max(saved.global_shape[d], piece.box.offset[d] + piece.box.shape[d]);
    if (dtensor_meta.is_object() && dtensor_meta.contains("global_shapes") && dtensor_meta["global_shapes"].contains(t.name))
      saved.global_shape = dtensor_meta["global_shapes"][t.name].get<Shape>();
    saved.pieces.push_back(piece);
  }
}

Catalog::Catalog(const std::string& dir_name) {
  const fs::path dir(dir_name);
  const bool committed = fs::exists(dir / kCommitFile);
  for (const std::string& name : files_of(dir)) {
    files_.push_back(std::make_unique<SafetensorsFile>((dir / name).string()));
    try {
      add_pieces(*files_.back(), committed, dir);
    } catch (const json::exception& e) {
      throw DTensorError("checkpoint: " + files_.back()->path() + ": its __metadata__ is malformed (" + e.what() +
                         "): the file is corrupted");
    }
  }
  // Pieces of one tensor are disjoint, so together they must hold exactly its elements.
  for (const auto& [name, saved] : tensors_) {
    int64_t held = 0;
    for (const SavedPiece& p : saved.pieces) {
      bool fits = p.box.shape.size() == saved.global_shape.size();
      for (size_t d = 0; fits && d < p.box.shape.size(); ++d)
        fits = p.box.offset[d] >= 0 && p.box.offset[d] + p.box.shape[d] <= saved.global_shape[d];
      if (!fits)
        throw DTensorError("checkpoint: tensor '" + name + "': the piece in " + p.file->path() + " at " +
                           shape_text(p.box.offset) + " of shape " + shape_text(p.box.shape) +
                           " does not fit its global shape " + shape_text(saved.global_shape));
      held += numel(p.box.shape);
    }
    if (held != numel(saved.global_shape))
      throw DTensorError("checkpoint: tensor '" + name + "' of global shape " + shape_text(saved.global_shape) +
                         ": the saved pieces hold " + std::to_string(held) + " of its " +
                         std::to_string(numel(saved.global_shape)) + " elements: a file of " + dir.string() +
                         " is missing or the pieces overlap");
  }
}

}  // namespace dtensor::checkpoint::detail
