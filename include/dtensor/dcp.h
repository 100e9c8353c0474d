#pragma once
// PyTorch's own distributed checkpoint format (torch.distributed.checkpoint with FileSystemWriter): a
// directory of .distcp files and a `.metadata` file, a pickle of DCP's Metadata. This header reads the
// metadata; reading the .distcp files and loading across meshes come next.
//
// The .metadata is untrusted: it is read by a restricted unpickler (src/io/restricted_pickle.h) that
// executes nothing and accepts only the globals such a file holds, then mapped field by field onto the
// structs below. Every field is checked (types, ranks, chunks inside their tensor and tiling it,
// offsets and lengths non-negative, storage files inside the directory, every chunk and bytes entry
// with its storage and every storage entry with its chunk); anything else is a DTensorError naming the
// file, the field and what was found.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dtensor/checkpoint.h"

namespace dtensor::checkpoint::dcp {

// One saved piece of a tensor (DCP's ChunkStorageMetadata): where it starts in the tensor, its shape.
struct DcpChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

// A tensor entry (DCP's TensorStorageMetadata and its TensorProperties).
struct DcpTensor {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> size;    // the global shape
  std::vector<DcpChunk> chunks;  // inside `size`, disjoint, together all of it
  bool requires_grad = false;    // as PyTorch recorded it (deprecated there)
  bool pin_memory = false;       // as PyTorch recorded it (deprecated there)
  std::optional<std::vector<int64_t>> strides;  // the saving rank's local strides, when recorded
};

// An entry saved as bytes (DCP's BytesStorageMetadata): anything not a tensor, torch.save'd.
struct DcpBytes {};

using DcpEntry = std::variant<DcpTensor, DcpBytes>;

// DCP's MetadataIndex: which item of which entry.
struct DcpItemIndex {
  std::string fqn;
  std::optional<std::vector<int64_t>> offset;  // a tensor chunk's offsets; none for bytes
  std::optional<int64_t> index;                // the chunk's position in its entry's chunks (a hint)
};

// FileSystemWriter's _StorageInfo: where an item's bytes are.
struct DcpStorage {
  std::string relative_path;  // a file of the checkpoint's directory ("__0_0.distcp")
  int64_t offset = 0;
  int64_t length = 0;
  std::vector<std::string> transform_descriptors;  // storage extensions (compression); none by default
};

struct DcpStorageMeta {
  std::optional<std::string> checkpoint_id;  // a path's parts joined with '/'
  std::optional<std::string> save_id;
  std::optional<std::string> load_id;
  std::vector<std::string> modules;
};

struct DcpMetadata {
  std::map<std::string, DcpEntry> entries;  // by fully qualified name (state_dict_metadata)
  // storage_data, in the file's order; every item of `entries` has exactly one.
  std::vector<std::pair<DcpItemIndex, DcpStorage>> storage;
  std::optional<std::string> version;  // DCP's format version ("1.0.0")
  std::optional<DcpStorageMeta> storage_meta;
};

// Saves `state` in PyTorch's DCP format, as FileSystemWriter of PyTorch 2.15 lays it out, so that
// torch.distributed.checkpoint.load reads it (onto any layout there too): each rank writes the pieces it
// owns as checkpoint::save assigns them (a DTensor's shard by the first rank holding it, Partial ones
// reduced first, a plain tensor by rank 0), each torch.save'd alone into its `__<rank>_0.distcp`, and
// rank 0 the pickled `.metadata`. Collective over the state's world, as checkpoint::save. Files of an
// earlier save with the same names are replaced; the directory has no commit marker (DCP has none:
// the `.metadata`, written last, is what makes it a checkpoint).
void save(const State& state, const std::string& dir);

// Reads `dir`/.metadata (or the file `path` when it is not a directory).
DcpMetadata read_metadata(const std::string& path);
// Parses the bytes of a .metadata file read from `source` (named in every error).
DcpMetadata parse_metadata(std::string_view bytes, const std::string& source);

}  // namespace dtensor::checkpoint::dcp
