#include "safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "dtensor/errors.h"
#include "dtypes.h"
#include "durable_file.h"

namespace dtensor::checkpoint::detail {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;  // what the safetensors library accepts

std::string error_in(const std::string& path, const std::string& what) { return "checkpoint: " + path + ": " + what; }

std::string shape_text(const Shape& shape) { return json(shape).dump(); }

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DTensorError(error_in(path_, std::string("cannot open it: ") + std::strerror(errno)));
  try {
    struct stat st{};
    if (::fstat(fd_, &st) != 0) throw DTensorError(error_in(path_, std::string("cannot stat it: ") + std::strerror(errno)));
    file_size_ = st.st_size;
    if (file_size_ < 8)
      throw DTensorError(error_in(path_, "the file is truncated: " + std::to_string(file_size_) +
                                             " bytes, not even the 8-byte header length"));
    uint64_t header_bytes = 0;
    read(0, 8, &header_bytes, "(the header length)");  // little-endian, as this machine
    if (static_cast<int64_t>(header_bytes) > kMaxHeaderBytes || static_cast<int64_t>(header_bytes) > file_size_ - 8)
      throw DTensorError(error_in(path_, "the header claims " + std::to_string(header_bytes) + " bytes but the file has " +
                                             std::to_string(file_size_) + ": it is truncated or not a safetensors file"));
    std::string text(header_bytes, '\0');
    read(8, static_cast<int64_t>(header_bytes), text.data(), "(the header)");
    const int64_t data_start = 8 + static_cast<int64_t>(header_bytes);
    json header;
    try {
      header = json::parse(text);
    } catch (const json::exception& e) {
      throw DTensorError(error_in(path_, std::string("the header is not valid JSON, the file is corrupted (") + e.what() + ")"));
    }
    if (!header.is_object()) throw DTensorError(error_in(path_, "the header is not a JSON object: the file is corrupted"));
    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        for (const auto& [k, v] : value.items()) {
          if (!v.is_string()) throw DTensorError(error_in(path_, "__metadata__[" + k + "] is not a string"));
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      StoredTensor t;
      t.name = key;
      try {
        t.dtype = value.at("dtype").get<std::string>();
        t.shape = value.at("shape").get<Shape>();
        const auto offsets = value.at("data_offsets").get<std::vector<int64_t>>();
        if (offsets.size() != 2) throw DTensorError("data_offsets must hold two numbers");
        t.begin = data_start + offsets[0];
        t.end = data_start + offsets[1];
      } catch (const json::exception& e) {
        throw DTensorError(error_in(path_, "tensor '" + key + "' has a malformed header entry (" + e.what() +
                                               "): the file is corrupted"));
      }
      if (std::any_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d < 0 || d > (int64_t{1} << 40); }))
        throw DTensorError(error_in(path_, "tensor '" + key + "' has shape " + shape_text(t.shape) + ": the file is corrupted"));
      int64_t element = 0;
      try {
        element = safetensors_element_size(t.dtype);
      } catch (const DTensorError&) {
        throw DTensorError(error_in(path_, "tensor '" + key + "' has dtype '" + t.dtype + "', which dtensor cannot load"));
      }
      const int64_t expected = numel(t.shape) * element;
      if (t.end - t.begin != expected || t.begin < data_start)
        throw DTensorError(error_in(path_, "tensor '" + key + "' spans bytes [" + std::to_string(t.begin) + ", " +
                                               std::to_string(t.end) + ") but its shape " + shape_text(t.shape) + " of " +
                                               t.dtype + " needs " + std::to_string(expected) + ": the file is corrupted"));
      if (t.end > file_size_)
        throw DTensorError(error_in(path_, "tensor '" + key + "' needs bytes up to " + std::to_string(t.end) +
                                               " but the file ends at " + std::to_string(file_size_) +
                                               ": the file is truncated"));
      tensors_.push_back(std::move(t));
    }
    void* mapped = ::mmap(nullptr, static_cast<size_t>(file_size_), PROT_READ, MAP_SHARED, fd_, 0);
    if (mapped != MAP_FAILED) mapped_ = static_cast<const char*>(mapped);  // else pread
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapped_) ::munmap(const_cast<char*>(mapped_), static_cast<size_t>(file_size_));
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::read(int64_t offset, int64_t bytes, void* out, const std::string& tensor) const {
  // Short runs (a row of a piece loaded into another layout) copy from the mapping; long ones go
  // through pread, which needs no page faults.
  constexpr int64_t kLongRun = int64_t{256} << 10;
  if (mapped_ && bytes < kLongRun && offset + bytes <= file_size_) {
    std::memcpy(out, mapped_ + offset, static_cast<size_t>(bytes));
    return;
  }
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw DTensorError(error_in(path_, "reading " + tensor + " failed: " + std::strerror(errno)));
    if (n == 0)
      throw DTensorError(error_in(path_, "reading " + tensor + " stopped at byte " + std::to_string(offset) +
                                             ": the file is truncated"));
    p += n;
    offset += n;
    bytes -= n;
  }
}

int64_t write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  std::vector<int64_t> sizes;
  for (const auto& t : tensors) {
    const int64_t bytes = numel(t.shape) * safetensors_element_size(t.dtype);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data 8-byte aligned, as the safetensors library writes
  const uint64_t header_bytes = text.size();
  DurableFile file(path);
  file.write(&header_bytes, 8);
  file.write(text.data(), static_cast<int64_t>(text.size()));
  for (size_t i = 0; i < tensors.size(); ++i) file.write(tensors[i].data, sizes[i]);
  file.commit();
  return 8 + static_cast<int64_t>(text.size()) + offset;
}

}  // namespace dtensor::checkpoint::detail
