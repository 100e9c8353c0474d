#include "zip_archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "checked_int.h"
#include "crc32.h"
#include "dtensor/errors.h"
#include "zip_directory.h"
#include "zip_format.h"

namespace dtensor::io {
namespace {

constexpr int64_t kChunk = int64_t{1} << 20;  // the streaming buffer

std::string hex(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

// zlib's inflate state, ended however the read ends.
class Inflater {
 public:
  Inflater() : ok_(inflateInit2(&z_, -15) == Z_OK) {}  // -15: raw deflate, as zip stores it
  ~Inflater() {
    if (ok_) inflateEnd(&z_);
  }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  bool ok() const { return ok_; }
  z_stream& z() { return z_; }

 private:
  z_stream z_{};
  bool ok_;
};

}  // namespace

ZipArchive::ZipArchive(std::string path) : ZipArchive(path, 0, -1, path) {}

ZipArchive::ZipArchive(std::string path, int64_t offset, int64_t length, std::string name)
    : path_(std::move(path)), name_(std::move(name)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DTensorError(name_ + ": cannot open it: " + std::strerror(errno));
  try {
    struct stat st{};
    if (::fstat(fd_, &st) != 0) throw DTensorError(name_ + ": cannot stat it: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw DTensorError(name_ + ": not a regular file");
    if (length < 0) {  // the whole file
      length = st.st_size;
    } else {
      const auto end = checked_add(offset, length);
      if (offset < 0 || !end || *end > st.st_size)
        throw DTensorError(name_ + ": the range of " + std::to_string(length) + " bytes at " + std::to_string(offset) +
                           " lies outside the file's " + std::to_string(st.st_size) + " bytes: the file is truncated or the metadata is wrong");
    }
    base_ = offset;
    file_size_ = length;
    entries_ = zip::read_directory(fd_, name_, base_, file_size_, folder_);
    for (size_t i = 0; i < entries_.size(); ++i) by_name_.emplace(entries_[i].name, i);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

ZipArchive::~ZipArchive() { ::close(fd_); }

void ZipArchive::fail(const ZipEntry& entry, const std::string& what) const {
  throw DTensorError(name_ + ": zip entry '" + (folder_.empty() ? "" : folder_ + "/") + entry.name + "': " + what);
}

void ZipArchive::read_exact(int64_t offset, int64_t bytes, void* out, const ZipEntry& entry) const {
  const std::string error = zip::read_at(fd_, base_ + offset, bytes, out);
  if (!error.empty()) fail(entry, error);
}

const ZipEntry* ZipArchive::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

template <typename Sink>
void ZipArchive::stream(const ZipEntry& entry, char* destination, Sink&& sink) const {
  uint32_t crc = 0;
  if (!entry.deflated) {
    std::vector<char> buffer(destination ? 0 : static_cast<size_t>(std::min(kChunk, entry.size)));
    for (int64_t done = 0; done < entry.size;) {
      const int64_t n = std::min(kChunk, entry.size - done);
      char* p = destination ? destination + done : buffer.data();
      read_exact(entry.data_offset + done, n, p, entry);
      crc = io::crc32(crc, p, static_cast<size_t>(n));
      if (!destination) sink(done, p, n);
      done += n;
    }
  } else {
    Inflater inflater;
    if (!inflater.ok()) fail(entry, "zlib could not start inflating");
    z_stream& z = inflater.z();
    std::vector<char> in(static_cast<size_t>(kChunk)), out(static_cast<size_t>(kChunk));
    int64_t read = 0, produced = 0;
    for (int status = Z_OK; status != Z_STREAM_END;) {
      if (z.avail_in == 0 && read < entry.compressed_size) {
        const int64_t n = std::min(kChunk, entry.compressed_size - read);
        read_exact(entry.data_offset + read, n, in.data(), entry);
        z.next_in = reinterpret_cast<Bytef*>(in.data());
        z.avail_in = static_cast<uInt>(n);
        read += n;
      }
      // One byte more room than the record has left, so that data inflating past it is caught.
      const int64_t room = std::min(kChunk, entry.size - produced + 1);
      z.next_out = reinterpret_cast<Bytef*>(out.data());
      z.avail_out = static_cast<uInt>(room);
      status = inflate(&z, Z_NO_FLUSH);
      const int64_t n = room - static_cast<int64_t>(z.avail_out);
      if (status != Z_OK && status != Z_STREAM_END && !(status == Z_BUF_ERROR && n == 0 && z.avail_in == 0 && read < entry.compressed_size))
        fail(entry, std::string("its deflated data is corrupted (") + (z.msg ? z.msg : "truncated") + ")");
      if (n > entry.size - produced) fail(entry, "it inflates to more than its declared " + std::to_string(entry.size) + " bytes");
      crc = io::crc32(crc, out.data(), static_cast<size_t>(n));
      if (destination) std::memcpy(destination + produced, out.data(), static_cast<size_t>(n));
      else sink(produced, out.data(), n);
      produced += n;
    }
    if (produced != entry.size || read != entry.compressed_size || z.avail_in != 0)
      fail(entry, "its deflated data does not match its declared sizes");
  }
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // fuzzing: mutated records must reach the parsers behind this check
  if (crc != entry.crc32)
    fail(entry, "CRC-32 mismatch (the directory says " + hex(entry.crc32) + ", the data gives " + hex(crc) +
                    "): the data is corrupted");
#endif
}

void ZipArchive::read_into(const ZipEntry& entry, void* out) const {
  stream(entry, static_cast<char*>(out), [](int64_t, const char*, int64_t) {});
}

std::string ZipArchive::read_text(const ZipEntry& entry, int64_t max_bytes) const {
  if (entry.size > max_bytes)
    fail(entry, "it holds " + std::to_string(entry.size) + " bytes, more than the " + std::to_string(max_bytes) + " dtensor reads for it");
  std::string text(static_cast<size_t>(entry.size), '\0');
  read_into(entry, text.data());
  return text;
}

void ZipArchive::read_ranges(const ZipEntry& entry, std::vector<RecordRange> ranges) const {
  for (const RecordRange& r : ranges) {
    const auto end = checked_add(r.offset, r.bytes);
    if (r.offset < 0 || r.bytes < 0 || !end || *end > entry.size)
      fail(entry, "a read of " + std::to_string(r.bytes) + " bytes at " + std::to_string(r.offset) + " lies outside its " +
                      std::to_string(entry.size) + " bytes");
  }
  std::sort(ranges.begin(), ranges.end(), [](const RecordRange& a, const RecordRange& b) { return a.offset < b.offset; });
  size_t first = 0;  // ranges before it are done
  stream(entry, nullptr, [&](int64_t offset, const char* data, int64_t n) {
    const int64_t chunk_end = offset + n;
    for (size_t i = first; i < ranges.size() && ranges[i].offset < chunk_end; ++i) {
      const RecordRange& r = ranges[i];
      const int64_t from = std::max(r.offset, offset), to = std::min(r.offset + r.bytes, chunk_end);
      if (from < to) std::memcpy(r.dst + (from - r.offset), data + (from - offset), static_cast<size_t>(to - from));
    }
    while (first < ranges.size() && ranges[first].offset + ranges[first].bytes <= chunk_end) ++first;
  });
}

}  // namespace dtensor::io
