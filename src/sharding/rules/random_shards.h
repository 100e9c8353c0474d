#pragma once
// Random ops drawn shard by shard (RandomMode::LocalShards, dtensor/random.h): each rank computes only
// the elements it holds, from a counter-based generator keyed by one draw per call, so an element's
// value depends on the key and its global index alone, never on the mesh or the layout.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <vector>

#include "dtensor/layout.h"

namespace dtensor::rules {

// A call's key: one number drawn from `generator` (the default one of `device` when empty). Every rank
// draws it alike, those outside the mesh too, so their generators stay in step.
uint64_t draw_key(const std::optional<at::Generator>& generator, c10::Device device);

// Uniform variates of one call at this rank's part of its output: the element of global row-major
// index g takes Philox-4x32-10 block g under the call's key, whose four words make two variates.
// Computed on the CPU and moved to `device`.
class Variates {
 public:
  Variates(uint64_t key, Shape global_shape, LocalLayout part, c10::Device device);

  // `count` (1 or 2) tensors of doubles in the open interval (0, 1), of the part's shape.
  std::vector<at::Tensor> uniform(int count) const;
  // Standard normal doubles (Box-Muller of both variates), of the part's shape.
  at::Tensor standard_normal() const;
  // The elements of `whole` (a replicated input, broadcast to the output's shape) that the part reads.
  at::Tensor part_of(const at::Tensor& whole) const;

 private:
  uint64_t key_;
  Shape global_shape_;
  LocalLayout part_;
  c10::Device device_;
};

// A random op's values at a part of its outputs, one tensor per output of the part's shape (in any
// dtype: the caller casts them), from the call's local arguments with the inputs already cut to the part.
using ShardDraw = std::vector<at::Tensor> (*)(const Variates&, c10::ArrayRef<c10::IValue> args);

// The shard-by-shard draw of `op`, or nullptr when the op only draws in the exact mode (random_).
ShardDraw shard_draw(const c10::OperatorName& op);

}  // namespace dtensor::rules
