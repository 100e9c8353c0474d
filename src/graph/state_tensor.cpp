// A program's weights, read from the archive on demand. torch.export stores each storage as one
// uncompressed record, 64-byte aligned, so a tensor's bytes sit at a known file offset: the whole
// tensor, or only the part one rank keeps, is read with pread of exactly those byte ranges.

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include "dtensor/errors.h"
#include "dtensor/graph/program.h"

namespace dtensor::graph {
namespace {

// Reads `bytes` at `offset` of `path` into `dst`.
void read_range(int fd, const std::string& path, int64_t offset, int64_t bytes, char* dst) {
  while (bytes > 0) {
    const ssize_t got = pread(fd, dst, static_cast<size_t>(bytes), offset);
    if (got <= 0) throw DTensorError(path + ": the archive ended inside a weight record (truncated?)");
    dst += got;
    offset += got;
    bytes -= got;
  }
}

class File {
 public:
  explicit File(const std::string& path) : path_(path), fd_(open(path.c_str(), O_RDONLY)) {
    if (fd_ < 0) throw DTensorError(path + ": cannot open the archive to read weights");
  }
  ~File() { close(fd_); }
  void read(int64_t offset, int64_t bytes, void* dst) const { read_range(fd_, path_, offset, bytes, static_cast<char*>(dst)); }

 private:
  std::string path_;
  int fd_;
};

}  // namespace

StateTensor::StateTensor(std::string archive, std::string record, int64_t offset, int64_t storage_elements, TensorMeta meta,
                         int64_t storage_offset)
    : archive_(std::move(archive)),
      record_(std::move(record)),
      offset_(offset),
      storage_elements_(storage_elements),
      storage_offset_(storage_offset),
      meta_(std::move(meta)) {}

StateTensor::StateTensor(at::Tensor t)
    : tensor_(std::move(t)), meta_{tensor_.sizes().vec(), tensor_.strides().vec(), tensor_.scalar_type()} {}

const TensorMeta& StateTensor::meta() const { return meta_; }

const at::Tensor& StateTensor::tensor() const {
  if (tensor_.defined()) return tensor_;
  at::Tensor storage = at::empty({storage_elements_}, at::TensorOptions().dtype(meta_.dtype));
  File(archive_).read(offset_, storage.nbytes(), storage.data_ptr());
  tensor_ = storage.as_strided(meta_.shape, meta_.stride, storage_offset_);
  return tensor_;
}

at::Tensor StateTensor::shard(const DeviceMesh& mesh, const Placements& placements) const {
  const Shape coordinate = mesh.coordinate().value_or(Shape(mesh.ndim(), 0));
  const LocalLayout part = local_layout(meta().shape, mesh.shape(), coordinate, placements);
  at::Tensor out = at::empty(part.shape, at::TensorOptions().dtype(meta().dtype));
  bool zero = false;
  for (size_t m = 0; m < placements.size(); ++m) zero = zero || (placements[m].is_partial() && coordinate[m] != 0);
  if (zero || out.numel() == 0) return out.zero_();
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
  const File file(archive_);
  char* dst = static_cast<char*>(out.data_ptr());
  Shape index(static_cast<size_t>(ndim), 0);  // within the part, over all dims but the run's
  int64_t pending_offset = -1, pending_bytes = 0;
  char* pending_dst = nullptr;
  auto flush = [&] {
    if (pending_bytes > 0) file.read(pending_offset, pending_bytes, pending_dst);
    pending_bytes = 0;
  };
  for (int64_t r = 0; r < runs; ++r) {
    int64_t element_index = storage_offset_;
    for (int64_t d = 0; d < ndim; ++d) element_index += (part.offset[d] + index[d]) * meta_.stride[d];
    const int64_t offset = offset_ + element_index * element, bytes = run * element;
    if (pending_bytes > 0 && pending_offset + pending_bytes == offset && pending_dst + pending_bytes == dst) {
      pending_bytes += bytes;
    } else {
      flush();
      pending_offset = offset;
      pending_bytes = bytes;
      pending_dst = dst;
    }
    dst += bytes;
    for (int64_t d = (unit_last ? ndim - 2 : ndim - 1); d >= 0; --d) {
      if (++index[d] < part.shape[d]) break;
      index[d] = 0;
    }
  }
  flush();
  return out;
}

}  // namespace dtensor::graph
