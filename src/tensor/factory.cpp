#include "dtensor/factory.h"

#include <ATen/ATen.h>

#include <functional>

#include "../redistribute/executor.h"
#include "dtensor/dtensor_impl.h"
#include "dtensor/errors.h"

namespace dtensor {
namespace {

using LocalFill = std::function<at::Tensor(const Shape& local_shape, const at::TensorOptions&)>;

at::Tensor empty_local(const Shape& shape, const at::TensorOptions& options) { return at::empty(shape, options); }

// The DTensor of `shape` whose shard on this rank `fill` makes from the local shape (every element of
// the whole tensor is the same, so a shard is the fill of its shape). A leaf: requires_grad is set on
// the DTensor, never on the local tensor.
at::Tensor make(const char* what, const Shape& shape, const MeshPtr& mesh, const std::optional<Placements>& placements,
                at::TensorOptions options, const LocalFill& fill) {
  if (!mesh) throw DTensorError(std::string(what) + ": the mesh is null; build one with DeviceMesh::create");
  for (int64_t s : shape)
    if (s < 0) throw DTensorError(std::string(what) + ": negative size in shape " + shape_str(shape));
  const auto ndim = static_cast<int64_t>(shape.size());
  Placements p = validate_placements(placements.value_or(Placements(mesh->ndim(), Replicate())), mesh->ndim(), ndim, what);
  const bool requires_grad = options.requires_grad();
  options = options.requires_grad(false);
  if (!options.has_device()) options = options.device(mesh->device_type());
  TensorMeta meta{shape, contiguous_strides(shape), c10::typeMetaToScalarType(options.dtype())};

  at::Tensor local = at::empty({0}, options);  // ranks outside the mesh hold an empty shard
  if (const auto& coordinate = mesh->coordinate()) {
    local = fill(local_shape(shape, mesh->shape(), *coordinate, p), options);
    for (int64_t m = 0; m < mesh->ndim(); ++m)
      if (p[m].is_partial())
        local = detail::partition_replicated(local, *mesh, m, p[m].reduce_op(), detail::Direction::Forward);
  }
  at::Tensor out = make_dtensor(local, DTensorSpec{mesh, std::move(p), std::move(meta)});
  if (requires_grad) out.set_requires_grad(true);
  return out;
}

// An empty DTensor filled in place by `fill_` (a random op), made a leaf afterwards.
at::Tensor filled(const char* what, const Shape& shape, const MeshPtr& mesh, const std::optional<Placements>& placements,
                  const at::TensorOptions& options, const std::function<void(at::Tensor&)>& fill_) {
  at::Tensor out = make(what, shape, mesh, placements, options.requires_grad(false), empty_local);
  fill_(out);
  if (options.requires_grad()) out.set_requires_grad(true);
  return out;
}

// A 1-d line of `steps` values (`line` makes the whole of it), each rank keeping its part.
at::Tensor spaced(const char* what, int64_t steps, const MeshPtr& mesh, const std::optional<Placements>& placements,
                  const at::TensorOptions& options, const std::function<at::Tensor(const at::TensorOptions&)>& line) {
  if (steps < 0) throw DTensorError(std::string(what) + ": steps must be >= 0, not " + std::to_string(steps));
  if (!mesh) throw DTensorError(std::string(what) + ": the mesh is null; build one with DeviceMesh::create");
  const Placements p = validate_placements(placements.value_or(Placements(mesh->ndim(), Replicate())), mesh->ndim(), 1, what);
  for (const Placement& placement : p)
    if (placement.is_multi_run_shard())
      throw DTensorError(std::string(what) + ": " + placement.str() + ": strided and head-tail placements are not supported");
  return make(what, {steps}, mesh, p, options, [&](const Shape&, const at::TensorOptions& o) {
    const LocalLayout part = local_layout({steps}, mesh->shape(), *mesh->coordinate(), p);
    return line(o).narrow(0, part.offset[0], part.shape[0]).clone();
  });
}

}  // namespace

at::Tensor linspace(const at::Scalar& start, const at::Scalar& end, int64_t steps, const MeshPtr& mesh,
                    std::optional<Placements> placements, const at::TensorOptions& options) {
  return spaced("dtensor::linspace", steps, mesh, placements, options,
                [&](const at::TensorOptions& o) { return at::linspace(start, end, steps, o); });
}

at::Tensor logspace(const at::Scalar& start, const at::Scalar& end, int64_t steps, double base, const MeshPtr& mesh,
                    std::optional<Placements> placements, const at::TensorOptions& options) {
  return spaced("dtensor::logspace", steps, mesh, placements, options,
                [&](const at::TensorOptions& o) { return at::logspace(start, end, steps, base, o); });
}

at::Tensor empty(const Shape& shape, const MeshPtr& mesh, std::optional<Placements> placements,
                 const at::TensorOptions& options) {
  return make("dtensor::empty", shape, mesh, placements, options, empty_local);
}

at::Tensor zeros(const Shape& shape, const MeshPtr& mesh, std::optional<Placements> placements,
                 const at::TensorOptions& options) {
  return make("dtensor::zeros", shape, mesh, placements, options,
              [](const Shape& s, const at::TensorOptions& o) { return at::zeros(s, o); });
}

at::Tensor ones(const Shape& shape, const MeshPtr& mesh, std::optional<Placements> placements,
                const at::TensorOptions& options) {
  return make("dtensor::ones", shape, mesh, placements, options,
              [](const Shape& s, const at::TensorOptions& o) { return at::ones(s, o); });
}

at::Tensor full(const Shape& shape, const at::Scalar& fill_value, const MeshPtr& mesh,
                std::optional<Placements> placements, const at::TensorOptions& options) {
  return make("dtensor::full", shape, mesh, placements, options,
              [&](const Shape& s, const at::TensorOptions& o) { return at::full(s, fill_value, o); });
}

// at::rand and at::randn are at::empty followed by uniform_ / normal_: the same ops on the empty
// DTensor draw what they draw, in the random mode of the call (see the random op rules).
at::Tensor rand(const Shape& shape, const MeshPtr& mesh, std::optional<Placements> placements,
                const at::TensorOptions& options, std::optional<at::Generator> generator) {
  return filled("dtensor::rand", shape, mesh, placements, options,
                [&](at::Tensor& t) { t.uniform_(0, 1, std::move(generator)); });
}

at::Tensor randn(const Shape& shape, const MeshPtr& mesh, std::optional<Placements> placements,
                 const at::TensorOptions& options, std::optional<at::Generator> generator) {
  return filled("dtensor::randn", shape, mesh, placements, options,
                [&](at::Tensor& t) { t.normal_(0, 1, std::move(generator)); });
}

}  // namespace dtensor
