#pragma once
// DTensor factories: a DTensor of a given global shape made directly on the mesh, each rank creating
// only its own shard (no communication). Default placements: all Replicate. A Partial placement holds
// the value as contributions that reduce to it (ones with Partial(sum): ones on the first rank along
// that mesh dim, zeros on the others). options.requires_grad() gives a leaf that requires grad.
//
// rand and randn fill the new DTensor with uniform_ / normal_, so they follow the random mode
// (dtensor/random.h; seed every rank alike): by default the values at::rand / at::randn give the whole
// tensor on one device with the same generator state, each rank drawing the whole tensor (O(global
// numel) per rank); under RandomMode::LocalShards each rank draws only its shard.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/TensorOptions.h>

#include <optional>

#include "dtensor/device_mesh.h"
#include "dtensor/placement.h"

namespace dtensor {

at::Tensor empty(const Shape& shape, const MeshPtr& mesh, std::optional<Placements> placements = std::nullopt,
                 const at::TensorOptions& options = {});
at::Tensor zeros(const Shape& shape, const MeshPtr& mesh, std::optional<Placements> placements = std::nullopt,
                 const at::TensorOptions& options = {});
at::Tensor ones(const Shape& shape, const MeshPtr& mesh, std::optional<Placements> placements = std::nullopt,
                const at::TensorOptions& options = {});
at::Tensor full(const Shape& shape, const at::Scalar& fill_value, const MeshPtr& mesh,
                std::optional<Placements> placements = std::nullopt, const at::TensorOptions& options = {});
// Uniform on [0, 1).
at::Tensor rand(const Shape& shape, const MeshPtr& mesh, std::optional<Placements> placements = std::nullopt,
                const at::TensorOptions& options = {}, std::optional<at::Generator> generator = std::nullopt);
// `steps` values evenly spaced from start to end (logspace: base to those powers), a 1-d DTensor. Each
// rank computes the whole line and keeps its part, so the values are at::linspace's / at::logspace's
// to the bit (O(steps) per rank). StridedShard is refused, as in PyTorch.
at::Tensor linspace(const at::Scalar& start, const at::Scalar& end, int64_t steps, const MeshPtr& mesh,
                    std::optional<Placements> placements = std::nullopt, const at::TensorOptions& options = {});
at::Tensor logspace(const at::Scalar& start, const at::Scalar& end, int64_t steps, double base, const MeshPtr& mesh,
                    std::optional<Placements> placements = std::nullopt, const at::TensorOptions& options = {});
// Standard normal.
at::Tensor randn(const Shape& shape, const MeshPtr& mesh, std::optional<Placements> placements = std::nullopt,
                 const at::TensorOptions& options = {}, std::optional<at::Generator> generator = std::nullopt);

}  // namespace dtensor
