// LoadOptions::dequantize: block-quantized weights (a float8 "X.weight" and its "X.weight_scale_inv")
// loaded dequantized, as PyTorch's QuantizedHuggingFaceStorageReader computes them; everything else as
// load.cpp loads it. Each rank reads only its box of the weight and the scales of the blocks it touches.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <set>

#include "dtensor/api.h"
#include "dtensor/errors.h"
#include "dtypes.h"
#include "format.h"
#include "job.h"
#include "loading.h"

namespace dtensor::checkpoint::detail {
namespace {

constexpr const char* kScaleSuffix = "_scale_inv";  // "X.weight" -> "X.weight_scale_inv"

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Blocks of `block` covering n elements (no overflow: block is at most 2^31, n a checked dim).
int64_t blocks_for(int64_t n, int64_t block) { return n == 0 ? 0 : 1 + (n - 1) / block; }

// Whether the checkpoint's `name` is stored block-quantized: a weight with its scales, as PyTorch's reader
// pairs them (only ".weight" tensors).
bool quantized(const Catalog& catalog, const std::string& name) {
  return ends_with(name, ".weight") && catalog.tensors().count(name + kScaleSuffix) > 0;
}

// The part `box` of the saved tensor, as a tensor of its stored dtype (only the bytes of the box read).
at::Tensor read_box(const std::string& name, const SavedTensor& saved, const Box& box) {
  const std::string file = saved.pieces.empty() ? std::string("the checkpoint") : saved.pieces.front().file;
  at::Tensor out = at::empty(box.shape, at::TensorOptions().dtype(scalar_type_of(saved.dtype, name, file)));
  for (const SavedPiece& piece : saved.pieces)
    if (const auto part = intersect(piece.box, box)) read_part(name, piece, *part, box, out);
  return out;
}

// Refuses a quantized weight whose scales do not fit it, naming both.
void check_scales(const std::string& name, const at::Tensor& tensor, const SavedTensor& weight, const SavedTensor& scales, int64_t block) {
  const std::string scale_name = name + kScaleSuffix;
  if (weight.global_shape.size() != 2 || tensor.sizes().vec() != weight.global_shape)
    throw DTensorError("checkpoint::load (dequantize): '" + name + "' is stored with shape " + shape_str(weight.global_shape) +
                       " for a state tensor of shape " + shape_str(tensor.sizes().vec()) +
                       "; block-quantized weights are 2-d and load into tensors of their shape");
  const Shape want = {blocks_for(weight.global_shape[0], block), blocks_for(weight.global_shape[1], block)};
  if (scales.global_shape != want)
    throw DTensorError("checkpoint::load (dequantize): '" + scale_name + "' has shape " + shape_str(scales.global_shape) + ", but '" +
                       name + "' " + shape_str(weight.global_shape) + " in blocks of " + std::to_string(block) + " needs " +
                       shape_str(want) + "; is block_size the checkpoint's?");
  const c10::ScalarType scale_type = scalar_type_of(scales.dtype, scale_name, "the checkpoint");
  if (!at::isFloatingType(scale_type))
    throw DTensorError("checkpoint::load (dequantize): '" + scale_name + "' is " + c10::toString(scale_type) + ", not a floating type");
  if (!at::isFloatingType(tensor.scalar_type()))
    throw DTensorError("checkpoint::load (dequantize): the state tensor '" + name + "' is " + c10::toString(tensor.scalar_type()) +
                       "; dequantized values need a floating dtype");
}

// This rank's box of the weight `name`, dequantized into `destination` (which holds `box`).
int64_t dequantize_into(const std::string& name, const SavedTensor& weight, const SavedTensor& scales, int64_t block, const Box& box,
                        at::Tensor& destination) {
  if (c10::multiply_integers(box.shape) == 0) return 0;
  const int64_t r0 = box.offset[0], c0 = box.offset[1];
  const Box scale_box{{r0 / block, c0 / block},
                      {blocks_for(r0 + box.shape[0], block) - r0 / block, blocks_for(c0 + box.shape[1], block) - c0 / block}};
  const at::Tensor values = read_box(name, weight, box);
  const at::Tensor scale = read_box(name + kScaleSuffix, scales, scale_box);
  // Each element's block scale, indexed at the box's own size (a grid of whole blocks would grow with
  // block_size, not with the box): row i of the box is in block (r0 + i) / b, counted from the scale box.
  const auto block_of = [&](int64_t first, int64_t n, int64_t first_block) {
    return at::arange(first, first + n, at::kLong).div(block, "floor").sub(first_block);
  };
  const at::Tensor spread = scale.to(at::kFloat)
                                .index_select(0, block_of(r0, box.shape[0], scale_box.offset[0]))
                                .index_select(1, block_of(c0, box.shape[1], scale_box.offset[1]));
  at::Tensor product = values.to(at::kFloat);
  product.mul_(spread);
  destination.copy_(product);  // cast once to the state tensor's dtype
  return static_cast<int64_t>(values.nbytes() + scale.nbytes());
}

// An MXFP4 tensor (gpt-oss: "X_blocks" with "X_scales"), which PyTorch's reader dequantizes and this one
// does not yet: refused when the state asks for it.
void refuse_mxfp4(const Catalog& catalog, const std::string& name) {
  if (!ends_with(name, "_blocks")) return;
  const std::string scales = name.substr(0, name.size() - std::string("_blocks").size()) + "_scales";
  if (catalog.tensors().count(scales))
    throw DTensorError("checkpoint::load (dequantize): '" + name + "' with '" + scales +
                       "' is an MXFP4 tensor (gpt-oss's layout), which dtensor does not dequantize yet");
}

}  // namespace

LoadResult load_dequantizing(const State& state, const std::string& dir, const LoadOptions& options, const Job& job) {
  const int64_t block = options.dequantize->block_size;
  if (block <= 0 || block > (int64_t{1} << 31))
    throw DTensorError("checkpoint::load: DequantizeOptions::block_size must be in [1, 2^31], not " + std::to_string(block));
  if (options.node_local) throw DTensorError("checkpoint::load: dequantize and node_local together are not supported; load from a shared directory");
  LoadResult result;
  std::exception_ptr error;
  try {
    const Catalog catalog(dir);
    // The checkpoint's entries: a quantized weight's scales are part of it, unless the state asks for
    // them by name (a model keeping them as buffers), which loads them as they are.
    std::set<std::string> saved;
    for (const auto& [name, tensor] : catalog.tensors()) {
      const bool scale_of_weight = ends_with(name, kScaleSuffix) && quantized(catalog, name.substr(0, name.size() - std::string(kScaleSuffix).size()));
      if (!scale_of_weight || state.count(name)) saved.insert(name);
    }
    match_names(state, saved, "checkpoint::load", dir, options.strict, result, options.partitioned);
    at::NoGradGuard no_grad;
    for (const auto& [name, tensor] : state) {
      const auto found = catalog.tensors().find(name);
      if (found == catalog.tensors().end()) continue;
      refuse_mxfp4(catalog, name);
      if (!quantized(catalog, name)) {  // as load reads it
        result.bytes_read += load_tensor(name, tensor, found->second);
        continue;
      }
      const auto scales = catalog.tensors().find(name + kScaleSuffix);
      check_scales(name, tensor, found->second, scales->second, block);
      auto target = target_of(name, tensor);
      if (!target) continue;
      auto& [box, destination] = *target;
      result.bytes_read += dequantize_into(name, found->second, scales->second, block, box, destination);
    }
  } catch (...) {
    error = std::current_exception();
  }
  job.agree(error, "loading " + dir);
  return result;
}

}  // namespace dtensor::checkpoint::detail
