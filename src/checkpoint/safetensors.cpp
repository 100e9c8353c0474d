#include "safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../io/checked_int.h"
#include "../io/json.h"
#include "../io/untrusted_json.h"
#include "dtensor/errors.h"
#include "dtensor/spec.h"
#include "dtypes.h"
#include "durable_file.h"

namespace dtensor::checkpoint::detail {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;  // what the safetensors library accepts

std::string error_in(const std::string& path, const std::string& what) { return "checkpoint: " + path + ": " + what; }

// One tensor's header entry: dtype, shape and data_offsets (relative to the data area), every field
// checked: a known dtype, non-negative dims whose byte count fits int64 and equals the range's.
StoredTensor stored_tensor(const std::string& name, const io::JsonField& entry, int64_t data_start) {
  StoredTensor t;
  t.name = name;
  const io::JsonField dtype = entry.at("dtype");
  t.dtype = dtype.as_string();
  int64_t element = 0;
  try {
    element = safetensors_element_size(t.dtype);
  } catch (const DTensorError&) {
    dtype.fail("'" + t.dtype.substr(0, 40) + "' is not a dtype dtensor can load");
  }
  t.shape = entry.at("shape").as_ints(0);
  const io::JsonField offsets_field = entry.at("data_offsets");
  const std::vector<int64_t> offsets = offsets_field.as_ints(0);
  if (offsets.size() != 2 || offsets[0] > offsets[1])
    offsets_field.fail("expected [begin, end] with begin <= end, found " + shape_str(offsets));
  const auto elements = io::checked_numel(t.shape);
  const auto bytes = elements ? io::checked_mul(*elements, element) : std::nullopt;
  if (!bytes) entry.at("shape").fail(shape_str(t.shape) + " holds more bytes than a file can");
  if (offsets[1] - offsets[0] != *bytes)
    offsets_field.fail("spans " + std::to_string(offsets[1] - offsets[0]) + " bytes, but shape " + shape_str(t.shape) + " of " +
                       t.dtype + " needs " + std::to_string(*bytes) + ": the file is corrupted");
  if (offsets[1] > INT64_MAX - data_start) offsets_field.fail("lies beyond any file");
  t.begin = data_start + offsets[0];
  t.end = data_start + offsets[1];
  return t;
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DTensorError(error_in(path_, std::string("cannot open it: ") + std::strerror(errno)));
  try {
    struct stat st{};
    if (::fstat(fd_, &st) != 0) throw DTensorError(error_in(path_, std::string("cannot stat it: ") + std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) throw DTensorError(error_in(path_, "not a regular file"));
    file_size_ = st.st_size;
    read_header();
    void* mapped = ::mmap(nullptr, static_cast<size_t>(file_size_), PROT_READ, MAP_SHARED, fd_, 0);
    if (mapped != MAP_FAILED) mapped_ = static_cast<const char*>(mapped);  // else pread
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

// The checks of the format's reference reader (the safetensors library): the header length within the
// file and the 100 MiB limit, a JSON object starting at the first byte and padded with spaces only, no
// duplicate keys, and tensors that tile the data area exactly: in order, without gaps or overlaps,
// ending where the file ends.
void SafetensorsFile::read_header() {
  if (file_size_ < 8)
    throw DTensorError(error_in(path_, "the file is truncated: " + std::to_string(file_size_) + " bytes, not even the 8-byte header length"));
  uint64_t header_bytes = 0;
  read(0, 8, &header_bytes, "");  // little-endian, as this machine
  if (header_bytes > static_cast<uint64_t>(kMaxHeaderBytes))
    throw DTensorError(error_in(path_, "the header claims " + std::to_string(header_bytes) + " bytes, more than the format's limit of " +
                                           std::to_string(kMaxHeaderBytes) + ": the file is corrupted or not a safetensors file"));
  if (header_bytes > static_cast<uint64_t>(file_size_ - 8))
    throw DTensorError(error_in(path_, "the header claims " + std::to_string(header_bytes) + " bytes but the file has " +
                                           std::to_string(file_size_) + ": it is truncated or not a safetensors file"));
  std::string text(header_bytes, '\0');
  read(8, static_cast<int64_t>(header_bytes), text.data(), "");
  const int64_t data_start = 8 + static_cast<int64_t>(header_bytes);
  const size_t last = text.find_last_not_of(' ');
  if (text.empty() || text.front() != '{' || last == std::string::npos || text[last] != '}')
    throw DTensorError(error_in(path_, "the header is not valid JSON, the file is corrupted (a header is a JSON object, padded with "
                                       "spaces only)"));
  const std::string where = error_in(path_, "header");
  const json header = io::parse_untrusted_json(text, where);
  for (const auto& [key, value] : io::JsonField(header, where).members()) {
    if (key == "__metadata__") {
      for (const auto& [k, v] : value.members()) metadata_[k] = v.as_string();
      continue;
    }
    tensors_.push_back(stored_tensor(key, value, data_start));
  }
  // The pieces tile the data area: sorted by where they start, each starts where the previous ends.
  std::vector<const StoredTensor*> order;
  for (const StoredTensor& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const StoredTensor* a, const StoredTensor* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (const StoredTensor* t : order)
    if (t->end > file_size_)
      throw DTensorError(error_in(path_, "tensor '" + t->name + "' needs bytes up to " + std::to_string(t->end) +
                                             " but the file ends at " + std::to_string(file_size_) + ": the file is truncated"));
  int64_t expected = data_start;
  for (const StoredTensor* t : order) {
    if (t->begin != expected)
      throw DTensorError(error_in(path_, "tensor '" + t->name + "' starts at byte " + std::to_string(t->begin - data_start) +
                                             " of the data, but the tensor before it ends at " + std::to_string(expected - data_start) + ": " +
                                             (t->begin < expected ? "their bytes overlap" : "a gap lies between them") +
                                             ", the file is corrupted"));
    expected = t->end;
  }
  if (expected != file_size_)
    throw DTensorError(error_in(path_, "the tensors end at byte " + std::to_string(expected) + " but the file has " +
                                           std::to_string(file_size_) + ": its header length is wrong or bytes were added, the file is corrupted"));
}

SafetensorsFile::~SafetensorsFile() {
  if (mapped_) ::munmap(const_cast<char*>(mapped_), static_cast<size_t>(file_size_));
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::fail_read(std::string_view tensor, const std::string& what) const {
  throw DTensorError(error_in(path_, (tensor.empty() ? std::string("reading the header") : "reading tensor '" + std::string(tensor) + "'") +
                                         ": " + what));
}

void SafetensorsFile::read(int64_t offset, int64_t bytes, void* out, std::string_view tensor) const {
  if (offset < 0 || bytes < 0 || offset > file_size_ || bytes > file_size_ - offset) [[unlikely]]
    fail_read(tensor, std::to_string(bytes) + " bytes at " + std::to_string(offset) + " lie outside the file's " +
                          std::to_string(file_size_));
  // Short runs (a row of a piece loaded into another layout) copy from the mapping; long ones go
  // through pread, which needs no page faults.
  constexpr int64_t kLongRun = int64_t{256} << 10;
  if (mapped_ && bytes < kLongRun) {
    std::memcpy(out, mapped_ + offset, static_cast<size_t>(bytes));
    return;
  }
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_read(tensor, std::string("failed: ") + std::strerror(errno));
    if (n == 0) fail_read(tensor, "stopped at byte " + std::to_string(offset) + ": the file is truncated");
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
