#pragma once
// Distributed checkpoints: a state of named tensors saved from any mesh and placements and loaded onto
// any other (another TP degree, a DP x TP mesh, one process), in the safetensors format.
//
// On disk (one directory):
//  - model-RRRRR-of-WWWWW.safetensors: what rank RRRRR-1 owns. A DTensor's shard is written by the first
//    rank holding it (a Replicate piece once, a Partial one reduced first), a plain tensor by rank 0
//    (SaveOptions::whole_tensors writes whole tensors instead, spread over the ranks). Each
//    file's "__metadata__" carries PyTorch DCP's sharding info (DCP_SHARDING_INFO: each tensor's
//    saved_offsets in the global tensor), so DCP's HuggingFaceStorageReader reads these checkpoints too,
//    and dtensor's own ("dtensor": each tensor's global shape).
//  - model.safetensors.index.json: Hugging Face's index ("weight_map": tensor -> its file, for tensors
//    saved whole; "metadata.total_size") plus a "dtensor" section listing every file and tensor.
//  - dtensor.commit: written last, after every rank's file is durable. A directory without it is an
//    unfinished save and is refused.
// Every file is written under a temporary name, fsync'd and renamed, so a crash leaves either the old
// file or the new one.
//
// Loading reads every file's header, then only the byte ranges this rank's shards need, straight from
// the files: no rank ever holds a whole tensor it does not hold a whole shard of. It also loads
// checkpoints written by PyTorch: `safetensors.torch.save_file` of whole tensors (one file or a Hugging
// Face index of several) and DCP's HuggingFaceStorageWriter (whole or sharded).
//
// Both are collective over the world of the state's DTensors: every rank calls them with the same
// names, shapes, dtypes and placements (plain tensors are taken to hold the same value on every rank),
// and every rank sees the directory (a local or shared file system), unless the save and the load are
// node-local (each node its own directory), or partitioned (pipeline stages holding different tensors:
// SaveOptions::partitioned).
//
// The index's weight_map names only the tensors saved whole (plain, or Replicate on every mesh dim):
// Hugging Face's loaders take an entry for the whole tensor, and a sharded one is in several files.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtensor {
class World;
}

namespace dtensor::checkpoint {

// Tensor handles by name. Loading writes into them in place (a DTensor's local shard, a plain tensor's
// data), so a state made of a module's parameters loads the module.
using State = std::map<std::string, at::Tensor>;

struct SaveOptions {
  // Replace a checkpoint already in the directory: its commit marker is removed first, so a crash
  // during the new save leaves a refused directory, never a mix of the two. Without it, saving into a
  // directory that holds a checkpoint is an error.
  bool overwrite = false;
  // The job's world for a state of plain tensors only (DTensors bring their mesh's world). Without
  // either, the save runs as one process.
  std::shared_ptr<World> world;
  // Write every tensor whole, each by one rank of its mesh (in turn, so the files share the bytes),
  // which gathers exactly its shards from the others (cross-mesh redistribute to that one rank). Every
  // file is then an ordinary Hugging Face shard: the weight_map names every tensor, and
  // transformers' from_pretrained or safetensors' load_file read them as they are. Costs the gathers.
  bool whole_tensors = false;
  // Each node has a directory of its own at `dir` (node-local disks, no shared file system; nodes are
  // told apart by host name): each rank's file stays on its node, and the first rank of each node
  // writes that node's copy of the index (which names the host holding every file) and of the commit
  // marker. Load it with LoadOptions::node_local. On a shared directory it saves as usual.
  bool node_local = false;
  // Ranks hold different tensors under names global to the model (pipeline stages: each rank its
  // stages' parameters and optimizer state), as PyTorch's DCP allows: every rank saves what it holds,
  // the index names them all, a plain tensor is written by the first rank that holds it, and a tensor
  // held by several ranks must have the same dtype, shape and (a DTensor) mesh and placements on each.
  // Load it into another partition with LoadOptions::partitioned, or whole as any checkpoint. Needs
  // `world` on every rank; not with whole_tensors or node_local.
  bool partitioned = false;
};

struct SaveResult {
  int64_t bytes_written = 0;  // by this rank, headers included
  std::string file;           // this rank's file, empty when it owns nothing
};

SaveResult save(const State& state, const std::string& dir, const SaveOptions& options = {});

// The same, with training going on while the files are written: the collectives a save needs (Partial
// shards reduced, whole tensors gathered) and a copy of what this rank writes (the staging copy) happen
// before it returns; preparing the directory, writing, and the ranks' agreement on each step happen on
// a thread of its own, which the future waits for (its destructor too). The state may change as soon as
// this returns. Every rank must call it, as for save. The background agreements go through the store on
// a channel of their own (World::sum_across_ranks), so the job may agree on other things meanwhile; at
// most one asynchronous save may be in flight, so wait for one before starting the next.
std::future<SaveResult> save_async(const State& state, const std::string& dir, const SaveOptions& options = {});

// PyTorch's QuantizedHuggingFaceStorageReader for LoadOptions::dequantize: Hugging Face checkpoints
// whose 2-d weights are stored block-quantized (DeepSeek-V3's FP8: "X.weight" in float8 and
// "X.weight_scale_inv", one float per block_size x block_size block, edge blocks partial). Each such
// weight loads dequantized, as PyTorch computes it with its default target_dtype (float32): the stored
// value in float32 times its block's scale, cast once to the state tensor's dtype. The scales are part
// of their weights, not state entries (a state that names one gets it as stored); other tensors load as
// usual. Not read: MXFP4's "X_blocks" with "X_scales" (gpt-oss), refused when the state asks for it.
struct DequantizeOptions {
  int64_t block_size = 128;
};

struct LoadOptions {
  // Every state tensor must be in the checkpoint and every checkpoint tensor in the state; otherwise the
  // error lists what is missing and unexpected. Non-strict: missing tensors are left as they are and
  // both lists are returned.
  bool strict = true;
  std::shared_ptr<World> world;  // as for save
  // Each node has a directory of its own at `dir`, holding some of the checkpoint's files (a node-local
  // save's, another number of nodes, or none for a node that was not in the save): each rank reads
  // what its node has and receives the rest from a rank whose node has it, in all-to-alls over the
  // world. Every element crosses the network at most once per node that needs it (ranks of a node that
  // need the same part get it from the first of them), and only when that node lacks it.
  bool node_local = false;
  // Dequantize block-quantized weights while loading (DequantizeOptions). Not with node_local.
  std::optional<DequantizeOptions> dequantize;
  // This rank's state is its part of the checkpoint (pipeline stages, SaveOptions::partitioned): every
  // state tensor must be in the checkpoint (with strict), the checkpoint's others are other ranks'.
  // Needs `world` on every rank; not with node_local.
  bool partitioned = false;
};

struct LoadResult {
  std::vector<std::string> missing;     // in the state, not in the checkpoint
  std::vector<std::string> unexpected;  // in the checkpoint, not in the state
  std::vector<std::string> skipped;     // dcp::load: the checkpoint's bytes entries (Python objects), not loaded
  int64_t bytes_read = 0;               // tensor data this rank read from files (for itself or, node-local, others)
  int64_t bytes_received = 0;           // node-local: tensor data other ranks sent this rank
  int64_t bytes_received_from_other_nodes = 0;  // node-local: the part of it that crossed the network
  int64_t bytes_sent = 0;               // node-local: tensor data this rank sent others
};

// Shape and dtype must match the checkpoint's (an error names the tensor, the file and both values).
LoadResult load(const State& state, const std::string& dir, const LoadOptions& options = {});

// Whether `dir` holds a finished dtensor checkpoint (its commit marker is present).
bool is_committed(const std::string& dir);

struct StoredTensorInfo {
  c10::ScalarType dtype;
  std::vector<int64_t> shape;  // global
};

// What a checkpoint directory holds, from its files' headers alone (one process, no data read): the
// same checks as load, so an unfinished or damaged checkpoint is an error here too.
std::map<std::string, StoredTensorInfo> contents(const std::string& dir);

}  // namespace dtensor::checkpoint
