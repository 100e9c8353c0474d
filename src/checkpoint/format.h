#pragma once
// The names and metadata keys of dtensor's checkpoint directories, and the catalog of a directory
// (dtensor's, or one PyTorch wrote): for every tensor its dtype, global shape and saved pieces.

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
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
// The index's record of a node-local save (in its dtensor section): file -> the host that wrote it.
inline constexpr const char* kNodesKey = "nodes";

// "model-00002-of-00004.safetensors" for rank 1 of 4 (Hugging Face's and DCP's numbering from 1).
std::string rank_file_name(int rank, int world_size);

struct SavedPiece {
  std::string file;                        // its path, for messages
  const SafetensorsFile* local = nullptr;  // null when the file is on another node (node-local loading)
  Box box;                                 // in the global tensor
  int64_t begin = 0;                       // its first byte in the file
};

struct SavedTensor {
  std::string dtype;  // safetensors dtype
  Shape global_shape;
  std::string shape_recorded_in;  // the file whose dtensor metadata gave the global shape; empty: where the pieces end
  std::vector<SavedPiece> pieces;
};

// One piece of a tensor as its file describes it: what a rank holding the file tells the ranks that do
// not (node-local loading).
struct DescribedPiece {
  std::string tensor;
  std::string dtype;
  SavedPiece piece;
  std::optional<Shape> global_shape;  // as dtensor recorded it
};

class Catalog {
 public:
  enum class Files {
    All,          // every file the checkpoint lists must be here
    PresentOnly,  // this node's share of a node-local checkpoint: the listed files that are here (none
                  // when the directory is absent); the tensors are not checked to be whole
  };
  // Reads the directory's index (when present) and every listed file's header. A dtensor checkpoint
  // without its commit marker, a missing file, a corrupt header or metadata, pieces that do not tile
  // their tensor exactly, or an index naming the wrong file is an error naming the directory, file
  // or tensor.
  explicit Catalog(const std::string& dir, Files files = Files::All);
  // The catalog of pieces described by the ranks holding their files, with the same checks.
  Catalog(std::string dir, const std::vector<DescribedPiece>& pieces);

  const std::map<std::string, SavedTensor>& tensors() const { return tensors_; }
  // Every piece of the files read here, in the order read.
  const std::vector<DescribedPiece>& described() const { return described_; }
  // The file of this directory named `name` (no path), or null when it was not read here.
  const SafetensorsFile* file_named(const std::string& name) const;
  // The files the directory's index names (empty without an index), whether read here or not.
  const std::vector<std::string>& listed_files() const { return listed_; }
  // A node-local dtensor checkpoint's record of which host wrote each file.
  const std::map<std::string, std::string>& file_hosts() const { return file_hosts_; }

 private:
  std::vector<std::string> files_of(const std::filesystem::path& dir, Files files);
  // The pieces one file holds, at their offsets (DCP's sharding info, else whole tensors).
  void add_pieces(const SafetensorsFile& file, bool committed, const std::filesystem::path& dir);
  void add(const DescribedPiece& described);
  // Sets the global shape (unless recorded) and checks that the pieces tile it exactly.
  void check_tiling(const std::string& name, SavedTensor& saved) const;
  // Every tensor's tiling, and the Hugging Face index's weight map against the files.
  void check_complete();

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, SavedTensor> tensors_;
  std::vector<DescribedPiece> described_;
  std::map<std::string, std::string> weight_map_;  // a Hugging Face index's: tensor -> file
  std::vector<std::string> listed_;
  std::map<std::string, std::string> file_hosts_;
};

}  // namespace dtensor::checkpoint::detail
