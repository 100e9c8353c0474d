#pragma once
// The safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and [begin, end) byte range in the data that
// follows (packed in order, no gaps), and an optional "__metadata__" map of strings.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/layout.h"

namespace dtensor::checkpoint::detail {

struct StoredTensor {
  std::string name;
  std::string dtype;
  Shape shape;
  int64_t begin = 0;  // absolute byte offsets in the file
  int64_t end = 0;
};

// A safetensors file opened for reading byte ranges (mapped into memory: loading into another layout
// reads many short runs). The file is untrusted: its header is validated when opened as the format's
// reference reader does (see read_header), and any flaw is an error naming the file, the tensor and
// the field. After that every tensor's byte range lies inside the file and is its own.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<StoredTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // `bytes` bytes from absolute offset `offset` into `out`, on behalf of tensor `tensor` ("" for the
  // header), which errors name. Loading into another layout calls it once per row: the hot path is a
  // bounds check and a copy.
  void read(int64_t offset, int64_t bytes, void* out, std::string_view tensor) const;

 private:
  void read_header();
  [[noreturn]] void fail_read(std::string_view tensor, const std::string& what) const;

  std::string path_;
  int fd_ = -1;
  int64_t file_size_ = 0;
  const char* mapped_ = nullptr;  // the whole file, read-only: a short run is a memcpy, not a system call
  std::vector<StoredTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  std::string dtype;
  Shape shape;
  const void* data;  // contiguous, numel(shape) * element size bytes
};

// Writes a safetensors file (temporary name, fsync, rename; see DurableFile). Returns the bytes written.
int64_t write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                          const std::map<std::string, std::string>& metadata);

}  // namespace dtensor::checkpoint::detail
