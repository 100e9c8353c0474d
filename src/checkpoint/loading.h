#pragma once
// What both ways of loading share (from one directory every rank sees, load.cpp; from node-local
// directories, node_local_load.cpp): matching the state against the catalog, each rank's target box,
// and copying saved bytes into a shard.

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "dtensor/checkpoint.h"
#include "dtensor/pieces.h"
#include "format.h"

namespace dtensor::checkpoint::detail {

// Fills result.missing and result.unexpected (not for a `partitioned` state: the checkpoint's other
// tensors are other ranks'); with `strict`, either being non-empty is an error.
void match_names(const State& state, const Catalog& catalog, const std::string& dir, bool strict, LoadResult& result,
                 bool partitioned = false);
// The same against the names `saved` of a checkpoint; errors start with `who` ("dcp::load").
void match_names(const State& state, const std::set<std::string>& saved, const std::string& who, const std::string& dir, bool strict,
                 LoadResult& result, bool partitioned = false);

// `tensor` as the saved tensor's shape asks: itself, or, for a 0-d plain tensor saved with shape [1], a
// [1] view of it: an optimizer step written by dtensor before steps became 0-d (as PyTorch keeps them).
at::Tensor as_saved(const at::Tensor& tensor, const SavedTensor& saved);

// The state's tensor `name` has the saved tensor's global shape and dtype, or an error names both.
void check_matches(const std::string& name, const at::Tensor& tensor, const SavedTensor& saved);

// This rank's box of `tensor` and the tensor its data goes into; nothing for ranks outside its mesh.
// A Partial DTensor is an error (it has no single value to load into).
std::optional<std::pair<Box, at::Tensor>> target_of(const std::string& name, const at::Tensor& tensor);

// The region of `destination` (which holds `target`) that `part` covers.
at::Tensor region_of(const at::Tensor& destination, const Box& part, const Box& target);

// The bytes of `part` (inside `piece`, whose file is on this node; elements of `element_size` bytes),
// row-major, into `out`.
void read_into(const std::string& name, const SavedPiece& piece, const Box& part, int64_t element_size, char* out);

// Writes `part` of `destination` (which holds `target`): `fill` gets its row-major bytes of dtype
// `stored` to fill, the region itself when it is contiguous CPU memory of that dtype, else a buffer
// copied in after (converting, as copy_ does). Returns the bytes filled.
int64_t fill_part(const Box& part, const Box& target, at::Tensor& destination, c10::ScalarType stored,
                  const std::function<void(char*)>& fill);

// Copies `part` of `piece` into `destination` (which holds `target`), reading only its bytes; returns them.
int64_t read_part(const std::string& name, const SavedPiece& piece, const Box& part, const Box& target, at::Tensor& destination);

// This rank's part of the state tensor `name` read from `saved` (shape and dtype checked); returns the bytes.
int64_t load_tensor(const std::string& name, const at::Tensor& tensor, const SavedTensor& saved);

struct Job;
// LoadOptions::node_local's load (load.cpp checks nothing before it).
LoadResult load_node_local(const State& state, const std::string& dir, bool strict, const Job& job);
// LoadOptions::dequantize's load (dequantizing_load.cpp).
LoadResult load_dequantizing(const State& state, const std::string& dir, const LoadOptions& options, const Job& job);

}  // namespace dtensor::checkpoint::detail
