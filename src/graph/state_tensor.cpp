// A program's weights, read from the archive on demand. torch.export stores each storage as one
// record, so a tensor's bytes sit at known offsets in it: the whole tensor, or only the part one rank
// keeps, is copied out of exactly those byte ranges, while the archive streams the record to check its
// CRC-32 (io::ZipArchive).

#include <ATen/ATen.h>

#include "../io/zip_archive.h"
#include "../redistribute/executor.h"
#include "dtensor/errors.h"
#include "dtensor/graph/program.h"

namespace dtensor::graph {

StateTensor::StateTensor(std::shared_ptr<const io::ZipArchive> archive, const io::ZipEntry& record, int64_t storage_elements,
                         TensorMeta meta, int64_t storage_offset)
    : archive_(std::move(archive)),
      record_(&record),
      storage_elements_(storage_elements),
      storage_offset_(storage_offset),
      meta_(std::move(meta)) {}

StateTensor::StateTensor(at::Tensor t)
    : tensor_(std::move(t)), meta_{tensor_.sizes().vec(), tensor_.strides().vec(), tensor_.scalar_type()} {}

const TensorMeta& StateTensor::meta() const { return meta_; }

bool StateTensor::same_tensor(const StateTensor& other) const {
  if (record_ || other.record_)
    return record_ == other.record_ && storage_offset_ == other.storage_offset_ && meta_ == other.meta_;
  return tensor_.defined() && tensor_.is_same(other.tensor_);
}

const at::Tensor& StateTensor::tensor() const {
  if (tensor_.defined()) return tensor_;
  at::Tensor storage = at::empty({storage_elements_}, at::TensorOptions().dtype(meta_.dtype));
  archive_->read_into(*record_, storage.data_ptr());
  tensor_ = storage.as_strided(meta_.shape, meta_.stride, storage_offset_);
  return tensor_;
}

namespace {

// A strided shard (a packed layer's weight) is a run per block, not one box: cut from the whole tensor,
// mesh dim by mesh dim as layout.h chunks (each StridedShard as redistribution cuts one).
at::Tensor strided_part(const at::Tensor& whole, const DeviceMesh& mesh, const Shape& coordinate, const Placements& placements) {
  at::Tensor t = whole;
  for (size_t m = 0; m < placements.size(); ++m) {
    const Placement& p = placements[m];
    const auto mesh_dim = static_cast<int64_t>(m);
    if (p.is_strided_shard()) {
      t = dtensor::detail::strided_chunk(t, p, mesh, mesh_dim);
    } else if (p.is_shard()) {
      const ChunkExtent e = chunk_extent(t.size(p.dim()), mesh.size(mesh_dim), coordinate[m]);
      t = t.narrow(p.dim(), e.offset, e.size);
    }
  }
  return t.contiguous();
}

}  // namespace

at::Tensor StateTensor::shard(const DeviceMesh& mesh, const Placements& placements) const {
  const Shape coordinate = mesh.coordinate().value_or(Shape(mesh.ndim(), 0));
  for (size_t m = 0; m < placements.size(); ++m)
    if (placements[m].is_partial() && coordinate[m] != 0)
      return at::zeros(local_shape(meta().shape, mesh.shape(), coordinate, placements), at::TensorOptions().dtype(meta().dtype));
  for (const Placement& p : placements)
    if (p.is_strided_shard()) {
      local_shape(meta().shape, mesh.shape(), coordinate, placements);  // throws unless each dim is whole blocks
      return strided_part(tensor(), mesh, coordinate, placements).clone();
    }
  const LocalLayout part = local_layout(meta().shape, mesh.shape(), coordinate, placements);
  at::Tensor out = at::empty(part.shape, at::TensorOptions().dtype(meta().dtype));
  if (out.numel() == 0) return out;
  if (tensor_.defined()) {
    at::Tensor region = tensor_;
    for (size_t d = 0; d < part.shape.size(); ++d) region = region.narrow(static_cast<int64_t>(d), part.offset[d], part.shape[d]);
    return out.copy_(region);
  }
  // Runs along the last dim (contiguous in the file when its stride is 1), merged when adjacent.
  const int64_t ndim = static_cast<int64_t>(part.shape.size());
  const int64_t element = static_cast<int64_t>(c10::elementSize(meta_.dtype));
  const bool unit_last = ndim > 0 && meta_.stride[ndim - 1] == 1;
  const int64_t run = unit_last ? part.shape[ndim - 1] : 1;
  const int64_t runs = out.numel() / run;
  char* dst = static_cast<char*>(out.data_ptr());
  Shape index(static_cast<size_t>(ndim), 0);  // within the part, over all dims but the run's
  std::vector<io::RecordRange> ranges;
  for (int64_t r = 0; r < runs; ++r) {
    int64_t element_index = storage_offset_;
    for (int64_t d = 0; d < ndim; ++d) element_index += (part.offset[d] + index[d]) * meta_.stride[d];
    const int64_t offset = element_index * element, bytes = run * element;
    if (!ranges.empty() && ranges.back().offset + ranges.back().bytes == offset && ranges.back().dst + ranges.back().bytes == dst)
      ranges.back().bytes += bytes;  // adjacent in the record and in the part: one copy
    else
      ranges.push_back({offset, bytes, dst});
    dst += bytes;
    for (int64_t d = (unit_last ? ndim - 2 : ndim - 1); d >= 0; --d) {
      if (++index[d] < part.shape[d]) break;
      index[d] = 0;
    }
  }
  archive_->read_ranges(*record_, std::move(ranges));
  return out;
}

}  // namespace dtensor::graph
