#pragma once
// The names and metadata keys of dtensor's checkpoint directories, and the catalog of a directory
// (dtensor's, or one PyTorch wrote): for every tensor its dtype, global shape and saved pieces.

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/pieces.h"
#include "safetensors.h"

namespace dtensor::checkpoint::detail {

inline constexpr const char* kIndexFile = "model.safetensors.index.json";  // Hugging Face's name
inline constexpr const char* kCommitFile = "dtensor.commit";
// Keys of a file's "__metadata__": PyTorch DCP's (HuggingFaceStorageWriter) and dtensor's own.
inline constexpr const char* kDcpShardingKey = "DCP_SHARDING_INFO";  // {"name": {"saved_offsets": [...]}}
inline constexpr const char* kDcpVersionKey = "DCP_VERSION";
inline constexpr const char* kDtensorKey = "dtensor";  // {"version": 1, "global_shapes": {"name": [...]}}
inline constexpr int kFormatVersion = 1;

// "model-00002-of-00004.safetensors" for rank 1 of 4 (Hugging Face's and DCP's numbering from 1).
std::string rank_file_name(int rank, int world_size);

struct SavedPiece {
  const SafetensorsFile* file;
  Box box;        // in the global tensor
  int64_t begin;  // its first byte in the file
};

struct SavedTensor {
  std::string dtype;  // safetensors dtype
  Shape global_shape;
  std::vector<SavedPiece> pieces;
};

class Catalog {
 public:
  // Reads the directory's index (when present) and every listed file's header. A dtensor checkpoint
  // without its commit marker, a missing file, a corrupt header or metadata, pieces that do not tile
  // their tensor exactly, or an index naming the wrong file is an error naming the directory, file
  // or tensor.
  explicit Catalog(const std::string& dir);
  const std::map<std::string, SavedTensor>& tensors() const { return tensors_; }

 private:
  std::vector<std::string> files_of(const std::filesystem::path& dir);
  // The pieces one file holds, at their offsets (DCP's sharding info, else whole tensors).
  void add_pieces(const SafetensorsFile& file, bool committed, const std::filesystem::path& dir);
  // Sets the global shape (unless recorded) and checks that the pieces tile it exactly.
  void check_tiling(const std::string& name, SavedTensor& saved) const;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, SavedTensor> tensors_;
  std::map<std::string, std::string> recorded_in_;  // tensor -> the file whose dtensor metadata gave its global shape
  std::map<std::string, std::string> weight_map_;   // a Hugging Face index's: tensor -> file
};

}  // namespace dtensor::checkpoint::detail
