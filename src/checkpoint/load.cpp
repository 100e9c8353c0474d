#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <set>

#include "dtensor/api.h"
#include "dtensor/checkpoint.h"
#include "dtensor/errors.h"
#include "dtensor/pieces.h"
#include "dtypes.h"
#include "format.h"
#include "job.h"
#include "loading.h"

namespace dtensor::checkpoint {
namespace detail {
namespace {

std::string list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 20; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 20) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

}  // namespace

void match_names(const State& state, const std::set<std::string>& saved, const std::string& who, const std::string& dir, bool strict,
                 LoadResult& result, bool partitioned) {
  for (const auto& [name, tensor] : state)
    if (!saved.count(name)) result.missing.push_back(name);
  for (const std::string& name : saved)
    if (!partitioned && !state.count(name)) result.unexpected.push_back(name);
  if (strict && (!result.missing.empty() || !result.unexpected.empty()))
    throw DTensorError(who + ": " + dir + " does not match the state (strict): " +
                       (result.missing.empty() ? "" : "missing from the checkpoint: " + list(result.missing)) +
                       (result.missing.empty() || result.unexpected.empty() ? "" : "; ") +
                       (result.unexpected.empty() ? "" : "not in the state: " + list(result.unexpected)) +
                       "; load with strict = false to load the rest and get both lists");
}

void match_names(const State& state, const Catalog& catalog, const std::string& dir, bool strict, LoadResult& result, bool partitioned) {
  std::set<std::string> saved;
  for (const auto& [name, tensor] : catalog.tensors()) saved.insert(name);
  match_names(state, saved, "checkpoint::load", dir, strict, result, partitioned);
}

std::optional<std::pair<Box, at::Tensor>> target_of(const std::string& name, const at::Tensor& tensor) {
  const Shape global = tensor.sizes().vec();
  if (!is_dtensor(tensor)) return std::make_pair(Box{Shape(global.size(), 0), global}, tensor);
  const DTensorSpec& spec = spec_of(tensor);
  if (spec.has_partial())
    throw DTensorError("checkpoint::load: tensor '" + name + "' is " + to_string(spec.placements) +
                       "; a Partial tensor has no single value to load into; redistribute it to Replicate or Shard first");
  if (!spec.mesh->contains_this_rank()) return std::nullopt;
  const LocalLayout l = local_layout(global, spec.mesh->shape(), *spec.mesh->coordinate(), spec.placements);
  return std::make_pair(Box{l.offset, l.shape}, local_tensor_of(tensor));
}

at::Tensor as_saved(const at::Tensor& tensor, const SavedTensor& saved) {
  const bool old_step = tensor.dim() == 0 && !is_dtensor(tensor) && saved.global_shape == Shape{1};
  return old_step ? tensor.view({1}) : tensor;
}

void check_matches(const std::string& name, const at::Tensor& tensor, const SavedTensor& saved) {
  const std::string where = saved.pieces.empty() ? std::string("the checkpoint") : saved.pieces.front().file;
  const Shape shape = tensor.sizes().vec();
  if (shape != saved.global_shape)
    throw DTensorError("checkpoint::load: tensor '" + name + "' has shape " + shape_str(shape) + " but " + where +
                       " holds it with shape " + shape_str(saved.global_shape) +
                       "; build the model with the checkpoint's sizes or leave this tensor out (strict = false)");
  const c10::ScalarType stored = scalar_type_of(saved.dtype, name, where);
  if (tensor.scalar_type() != stored)
    throw DTensorError("checkpoint::load: tensor '" + name + "' is " + c10::toString(tensor.scalar_type()) + " but " +
                       where + " holds it as " + c10::toString(stored) + " (" + saved.dtype +
                       "); load into a tensor of that dtype and convert");
}

at::Tensor region_of(const at::Tensor& destination, const Box& part, const Box& target) {
  at::Tensor region = destination;
  for (size_t d = 0; d < part.shape.size(); ++d)
    region = region.narrow(static_cast<int64_t>(d), part.offset[d] - target.offset[d], part.shape[d]);
  return region;
}

void read_into(const std::string& name, const SavedPiece& piece, const Box& part, int64_t element_size, char* out) {
  for (const ContiguousRun& run : runs_within(piece.box, part))
    piece.local->read(piece.begin + run.piece_offset * element_size, run.length * element_size,
                      out + run.part_offset * element_size, name);
}

int64_t fill_part(const Box& part, const Box& target, at::Tensor& destination, c10::ScalarType stored,
                  const std::function<void(char*)>& fill) {
  at::Tensor region = region_of(destination, part, target);
  const bool direct = region.is_contiguous() && region.device().is_cpu() && !region.is_conj() && !region.is_neg() &&
                      region.scalar_type() == stored;
  at::Tensor buffer = direct ? region : at::empty(part.shape, destination.options().device(at::kCPU).dtype(stored));
  fill(static_cast<char*>(buffer.data_ptr()));
  if (direct) destination.unsafeGetTensorImpl()->bump_version();  // as copy_ would: autograd sees the change
  else region.copy_(buffer);
  return static_cast<int64_t>(buffer.nbytes());
}

int64_t read_part(const std::string& name, const SavedPiece& piece, const Box& part, const Box& target, at::Tensor& destination) {
  const int64_t element_size = static_cast<int64_t>(destination.element_size());
  return fill_part(part, target, destination, destination.scalar_type(),
                   [&](char* out) { read_into(name, piece, part, element_size, out); });
}

int64_t load_tensor(const std::string& name, const at::Tensor& tensor, const SavedTensor& saved) {
  const at::Tensor into = as_saved(tensor, saved);
  check_matches(name, into, saved);
  auto target = target_of(name, into);
  if (!target) return 0;
  auto& [box, destination] = *target;
  int64_t bytes = 0;
  for (const SavedPiece& piece : saved.pieces)
    if (const auto part = intersect(piece.box, box)) bytes += read_part(name, piece, *part, box, destination);
  return bytes;
}

}  // namespace detail

LoadResult load(const State& state, const std::string& dir, const LoadOptions& options) {
  detail::check_partitioned(options.partitioned, options.node_local, options.world, "load");
  const detail::Job job = detail::Job::of(state, options.world, "load");
  if (options.dequantize) return detail::load_dequantizing(state, dir, options, job);
  if (options.node_local) return detail::load_node_local(state, dir, options.strict, job);
  LoadResult result;
  std::exception_ptr error;
  try {
    const detail::Catalog catalog(dir);
    detail::match_names(state, catalog, dir, options.strict, result, options.partitioned);
    at::NoGradGuard no_grad;
    for (const auto& [name, tensor] : state) {
      const auto found = catalog.tensors().find(name);
      if (found != catalog.tensors().end()) result.bytes_read += detail::load_tensor(name, tensor, found->second);
    }
  } catch (...) {
    error = std::current_exception();
  }
  job.agree(error, "loading " + dir);
  return result;
}

std::map<std::string, StoredTensorInfo> contents(const std::string& dir) {
  const detail::Catalog catalog(dir);
  std::map<std::string, StoredTensorInfo> out;
  for (const auto& [name, saved] : catalog.tensors()) {
    const std::string file = saved.pieces.empty() ? dir : saved.pieces.front().file;
    out[name] = StoredTensorInfo{detail::scalar_type_of(saved.dtype, name, file), saved.global_shape};
  }
  return out;
}

}  // namespace dtensor::checkpoint
