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

int64_t blocks_for(int64_t n, int64_t block) { return (n + block - 1) / block; }

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
  // Each block's scale over its elements, cut to the box (which need not start on a block).
  const at::Tensor spread = scale.to(at::kFloat)
                                .repeat_interleave(block, 0)
                                .repeat_interleave(block, 1)
                                .narrow(0, r0 - scale_box.offset[0] * block, box.shape[0])
                                .narrow(1, c0 - scale_box.offset[1] * block, box.shape[1]);
  destination.copy_(values.to(at::kFloat).mul(spread).to(destination.scalar_type()));
  return static_cast<int64_t>(values.nbytes() + scale.nbytes());
}

}  // namespace

LoadResult load_dequantizing(const State& state, const std::string& dir, const LoadOptions& options, const Job& job) {
  const int64_t block = options.dequantize->block_size;
  if (block <= 0) throw DTensorError("checkpoint::load: DequantizeOptions::block_size must be positive, not " + std::to_string(block));
  if (options.node_local) throw DTensorError("checkpoint::load: dequantize and node_local together are not supported; load from a shared directory");
  LoadResult result;
  std::exception_ptr error;
  try {
    const Catalog catalog(dir);
    std::set<std::string> saved;  // the checkpoint's entries: the scales of quantized weights are not
    for (const auto& [name, tensor] : catalog.tensors()) {
      if (ends_with(name, "_blocks") || ends_with(name, "_scales"))
        throw DTensorError("checkpoint::load (dequantize): " + dir + " holds '" + name +
                           "', an MXFP4 tensor (gpt-oss's _blocks / _scales), which dtensor does not dequantize yet");
      const bool scale_of_weight = ends_with(name, std::string(".weight") + kScaleSuffix) &&
                                   catalog.tensors().count(name.substr(0, name.size() - std::string(kScaleSuffix).size()));
      if (!scale_of_weight) saved.insert(name);
    }
    match_names(state, saved, "checkpoint::load", dir, options.strict, result);
    at::NoGradGuard no_grad;
    for (const auto& [name, tensor] : state) {
      const auto found = catalog.tensors().find(name);
      if (found == catalog.tensors().end()) continue;
      const auto scales = catalog.tensors().find(name + kScaleSuffix);
      if (scales == catalog.tensors().end()) {  // not quantized: as load reads it
        result.bytes_read += load_tensor(name, tensor, found->second);
        continue;
      }
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
