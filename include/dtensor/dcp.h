#pragma once
// PyTorch's own distributed checkpoint format (torch.distributed.checkpoint with FileSystemWriter): a
// directory of .distcp files and a `.metadata` file, a pickle of DCP's Metadata. This header reads the
// metadata, loads the checkpoint's tensors onto any mesh and placements (dcp::load), and writes the
// format from any layout (dcp::save), all below.
//
// The .metadata is untrusted: it is read by a restricted unpickler (src/io/restricted_pickle.h) that
// executes nothing and accepts only the globals such a file holds, then mapped field by field onto the
// structs below. Every field is checked (types, ranks, chunks inside their tensor and tiling it,
// offsets and lengths non-negative, storage files inside the directory, every chunk and bytes entry
// with its storage and every storage entry with its chunk); anything else is a DTensorError naming the
// file, the field and what was found.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
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

// The names a PyTorch trainer's checkpoint gives its state: torch.distributed.checkpoint flattens
// {"model": model_sd, "optim": optim_sd} of get_state_dict into "model.<fqn>" and
// "optim.state.<fqn>.<name>" ("optim.state.layers.0.w1.weight.exp_avg"). `model` and `optimizer` are
// get_state_dict's two dicts (dtensor/state_dict.h; dtensor's optimizer dict is PyTorch's "state",
// flattened already). The tensors are shared, not copied: dcp::load into the result fills both dicts,
// and set_state_dict then puts them into the module and optimizer, as PyTorch's recipe does. (The
// optimizer's "param_groups" are bytes entries, which load skips: in C++ they are the optimizer's
// options.)
State pytorch_training_state(const State& model, const State& optimizer);

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

// One tensor item of a checkpoint in `dir`: the chunk `chunk` of the tensor `fqn` (of `dtype`), which
// FileSystemWriter torch.save'd into the bytes `storage` names (a zip archive: data.pkl and the
// storage's record). The zip is read with every field checked (src/io/zip_archive.h), data.pkl by the
// restricted unpickler with the globals of a torch.save'd tensor only (_rebuild_tensor_v2/_v3, the
// storage classes, OrderedDict), and then: the range lies inside the file; the storage's dtype and
// element count match its record's size; the tensor's size, stride and offset lie inside the storage;
// its dtype and size are the chunk's. Anything else is a DTensorError naming the file, the range, the
// item and the field. Returns the chunk, a contiguous CPU tensor.
at::Tensor read_tensor_item(const std::string& dir, const DcpStorage& storage, const std::string& fqn, const DcpChunk& chunk,
                            c10::ScalarType dtype);

// The bytes entries of the checkpoint in `dir` whose names start with `prefix` (all for ""): the Python
// values FileSystemWriter torch.save'd for them, read by the restricted unpickler, which runs nothing:
// None, bool, int, float, str, and tuples, lists and dicts of them, as c10::IValue (None, Bool, Int,
// Double, String, Tuple, GenericList, GenericDict). Anything else (an object of a class, bytes, a set, a
// tensor inside) is a DTensorError naming the entry and the field. Read by the calling rank alone. A
// value the pickle refers to twice is one shared IValue, as in Python: walk the result by its meaning
// (the keys you expect), not recursively without a bound.
// What a PyTorch trainer's optimizer keeps there ("optim.param_groups.0.lr", ".betas", ".params") sets
// a LibTorch optimizer's options through checkpoint::set_param_groups (dtensor/state_dict.h).
std::map<std::string, c10::IValue> read_objects(const std::string& dir, const std::string& prefix = "");

// One bytes entry's value, as read_objects reads it, from the bytes `storage` names.
c10::IValue read_object_item(const std::string& dir, const DcpStorage& storage, const std::string& fqn);

// Loads the tensors of the DCP checkpoint in `dir` into `state` in place, as checkpoint::load does for
// dtensor's own checkpoints: DTensors of any mesh and placements (Replicate and Shard; not Partial) or
// plain tensors, whatever mesh the checkpoint was saved from. Each rank opens only the items (chunks)
// that overlap its own shards and copies only the overlaps; each such item's record streams through
// once whole, so that its CRC-32 is checked.
//  - options.strict (default): every state tensor is a tensor entry of the checkpoint and every tensor
//    entry is in the state, else an error lists both (non-strict: they are returned in the result).
//  - Shapes must be the checkpoint's. A tensor of another dtype gets the saved values converted, as
//    PyTorch's dcp.load converts them (copy_): PyTorch keeps Adam's step as float32, dtensor as int64.
//  - Bytes entries (Python values torch.save'd: ints, strings, lists) are not tensors: they are listed
//    in result.skipped (read_objects reads them); a state tensor named like one is an error.
//  - options.node_local is refused (every rank must see the directory).
// Collective over the state's world like checkpoint::load: an error on one rank is raised on all.
LoadResult load(const State& state, const std::string& dir, const LoadOptions& options = {});

}  // namespace dtensor::checkpoint::dcp
