#include "zip_archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <tuple>

#include "checked_int.h"
#include "dtensor/errors.h"

namespace dtensor::io {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50, kZip64Locator = 0x07064b50, kDataDescriptor = 0x08074b50;
constexpr int64_t kLocalHeaderBytes = 30, kCentralHeaderBytes = 46, kEndBytes = 22, kZip64EndBytes = 56, kLocatorBytes = 20;
constexpr uint16_t kFlagEncrypted = 1, kFlagDataDescriptor = 8, kFlagStrongEncryption = 64;
constexpr uint16_t kStored = 0, kDeflated = 8;
// Deflate cannot expand data by more than about 1032:1; a record claiming more is a forgery (a "zip
// bomb"), refused before anything is allocated for it.
constexpr int64_t kMaxDeflateRatio = 1032;
constexpr int64_t kChunk = int64_t{1} << 20;  // the streaming buffer

// Little-endian fields of a byte buffer whose size the caller has checked.
uint16_t u16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t u32(const unsigned char* p) { return u16(p) | (static_cast<uint32_t>(u16(p + 2)) << 16); }
uint64_t u64(const unsigned char* p) { return u32(p) | (static_cast<uint64_t>(u32(p + 4)) << 32); }

std::string hex(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

// A name inside the archive must be a plain relative path: nothing that could name a file outside
// the archive's folder if a tool extracted it, and nothing two spellings could make ambiguous.
std::string bad_name_reason(const std::string& name) {
  if (name.empty()) return "an empty name";
  if (name.find('\0') != std::string::npos) return "a NUL byte in the name";
  if (name.find('\\') != std::string::npos) return "a backslash in the name";
  if (name.front() == '/') return "an absolute path";
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('/', start), name.size());
    const std::string part = name.substr(start, end - start);
    const bool last = end == name.size();
    if (part == "." || part == "..") return "a '" + part + "' component";
    if (part.empty() && !last) return "an empty path component";
    start = end + 1;
  }
  return "";
}

// Reads exactly `bytes` at `offset`; "" when done, else what went wrong.
std::string read_at(int fd, int64_t offset, int64_t bytes, void* out) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::string("reading failed: ") + std::strerror(errno);
    if (n == 0) return "the file ends at byte " + std::to_string(offset) + ": it was truncated";
    p += n;
    offset += n;
    bytes -= n;
  }
  return "";
}

struct CentralEntry {
  ZipEntry entry;
  std::string full_name;
  uint16_t flags = 0, method = 0;
  int64_t header_offset = 0;
};

// Reads and validates the archive's directory (see zip_archive.h for what is checked).
class DirectoryReader {
 public:
  DirectoryReader(int fd, const std::string& path, int64_t file_size) : fd_(fd), path_(path), file_size_(file_size) {}

  // The entries, names stripped of the folder, in directory order; sets `folder`.
  std::vector<ZipEntry> entries(std::string& folder) {
    const auto [count, directory_offset, directory_size] = end_record();
    std::vector<CentralEntry> central = central_directory(count, directory_offset, directory_size);
    folder = check_names(central);
    std::vector<std::pair<int64_t, int64_t>> spans;  // [local header, end of data and descriptor)
    std::vector<ZipEntry> entries;
    for (CentralEntry& c : central) {
      c.entry.name = c.full_name.substr(folder.size() + 1);
      check_method(c);
      spans.emplace_back(c.header_offset, check_local_header(c, static_cast<int64_t>(directory_offset)));
      entries.push_back(std::move(c.entry));
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].first < spans[i - 1].second)
        throw corrupt("two entries overlap (bytes " + std::to_string(spans[i].first) + " to " + std::to_string(spans[i - 1].second) + ")");
    return entries;
  }

 private:
  DTensorError corrupt(const std::string& what) const {
    return DTensorError(path_ + ": not a valid zip archive (.pt2 files are zip archives): " + what);
  }
  DTensorError bad_entry(const CentralEntry& c, const std::string& what) const {
    return DTensorError(path_ + ": zip entry '" + c.full_name.substr(0, 200) + "': " + what + ": the archive is corrupted");
  }
  void read(int64_t offset, int64_t bytes, void* out) const {
    const std::string error = read_at(fd_, offset, bytes, out);
    if (!error.empty()) throw corrupt(error);
  }

  // The end-of-central-directory record (the zip64 one when present, as PyTorch always writes it):
  // the entry count, and the central directory's offset and size.
  std::tuple<uint64_t, uint64_t, uint64_t> end_record() const {
    if (file_size_ < kEndBytes) throw corrupt("the file has " + std::to_string(file_size_) + " bytes, too few for a zip archive");
    // The last record whose comment ends exactly at the file's end.
    const int64_t tail_bytes = std::min<int64_t>(file_size_, kEndBytes + 0xFFFF);
    std::vector<unsigned char> tail(static_cast<size_t>(tail_bytes));
    read(file_size_ - tail_bytes, tail_bytes, tail.data());
    int64_t found = -1;
    for (int64_t i = tail_bytes - kEndBytes; i >= 0 && found < 0; --i)
      if (u32(&tail[i]) == kEndOfDirectory && i + kEndBytes + u16(&tail[i + 20]) == tail_bytes) found = i;
    if (found < 0) throw corrupt("no end-of-central-directory record at the end of the file (truncated?)");
    const unsigned char* end = &tail[found];
    const int64_t end_offset = file_size_ - tail_bytes + found;
    uint64_t count = u16(end + 10), size = u32(end + 12), offset = u32(end + 16);
    if (u16(end + 4) != 0 || u16(end + 6) != 0) throw corrupt("multi-disk archives are not supported");
    if (u16(end + 8) != u16(end + 10)) throw corrupt("the end record's entry counts disagree");
    int64_t limit = end_offset;  // where the central directory must end
    if (end_offset >= kLocatorBytes + kZip64EndBytes) {
      unsigned char locator[kLocatorBytes];
      read(end_offset - kLocatorBytes, kLocatorBytes, locator);
      if (u32(locator) == kZip64Locator) {
        const uint64_t at = u64(locator + 8);
        if (u32(locator + 4) != 0 || u32(locator + 16) > 1) throw corrupt("multi-disk archives are not supported");
        if (at > static_cast<uint64_t>(end_offset - kLocatorBytes - kZip64EndBytes)) throw corrupt("the zip64 end record lies outside the file");
        unsigned char record[kZip64EndBytes];
        read(static_cast<int64_t>(at), kZip64EndBytes, record);
        if (u32(record) != kZip64End) throw corrupt("the zip64 locator points at no zip64 end record");
        if (u32(record + 16) != 0 || u32(record + 20) != 0) throw corrupt("multi-disk archives are not supported");
        if (u64(record + 24) != u64(record + 32)) throw corrupt("the zip64 end record's entry counts disagree");
        const uint64_t count64 = u64(record + 32), size64 = u64(record + 40), offset64 = u64(record + 48);
        // The classic record holds either the same values or the zip64 placeholders.
        if ((count != 0xFFFF && count != count64) || (size != 0xFFFFFFFF && size != size64) || (offset != 0xFFFFFFFF && offset != offset64))
          throw corrupt("the end record and the zip64 end record disagree");
        count = count64;
        size = size64;
        offset = offset64;
        limit = static_cast<int64_t>(at);
      }
    }
    if (offset > static_cast<uint64_t>(limit) || size != static_cast<uint64_t>(limit) - offset)
      throw corrupt("the central directory (" + std::to_string(size) + " bytes at " + std::to_string(offset) +
                    ") does not end where the end record starts (byte " + std::to_string(limit) + ")");
    if (count > size / kCentralHeaderBytes) throw corrupt(std::to_string(count) + " entries cannot fit the central directory");
    return {count, offset, size};
  }

  std::vector<CentralEntry> central_directory(uint64_t count, uint64_t offset, uint64_t size) const {
    std::vector<unsigned char> directory(static_cast<size_t>(size));
    read(static_cast<int64_t>(offset), static_cast<int64_t>(size), directory.data());
    std::vector<CentralEntry> central;
    central.reserve(static_cast<size_t>(count));
    size_t at = 0;
    for (uint64_t i = 0; i < count; ++i) {
      const std::string which = "central directory entry " + std::to_string(i);
      if (directory.size() - at < kCentralHeaderBytes || u32(&directory[at]) != kCentralHeader) throw corrupt(which + " is malformed");
      const unsigned char* h = &directory[at];
      const size_t name_bytes = u16(h + 28), extra_bytes = u16(h + 30), comment_bytes = u16(h + 32);
      if (directory.size() - at - kCentralHeaderBytes < name_bytes + extra_bytes + comment_bytes) throw corrupt(which + " overruns the directory");
      CentralEntry c;
      c.flags = u16(h + 8);
      c.method = u16(h + 10);
      c.entry.crc32 = u32(h + 16);
      c.full_name.assign(reinterpret_cast<const char*>(h + kCentralHeaderBytes), name_bytes);
      uint64_t compressed = u32(h + 20), uncompressed = u32(h + 24), header_offset = u32(h + 42);
      if (!read_zip64_extra(h + kCentralHeaderBytes + name_bytes, extra_bytes, {&uncompressed, &compressed, &header_offset}))
        throw bad_entry(c, "its extra fields are malformed");
      if (u16(h + 34) != 0) throw bad_entry(c, "it starts on another disk");
      if (uncompressed > static_cast<uint64_t>(INT64_MAX) || compressed > static_cast<uint64_t>(file_size_) ||
          header_offset > static_cast<uint64_t>(file_size_))
        throw bad_entry(c, "its sizes or offset lie beyond the file");
      c.entry.size = static_cast<int64_t>(uncompressed);
      c.entry.compressed_size = static_cast<int64_t>(compressed);
      c.header_offset = static_cast<int64_t>(header_offset);
      central.push_back(std::move(c));
      at += kCentralHeaderBytes + name_bytes + extra_bytes + comment_bytes;
    }
    if (at != directory.size()) throw corrupt("the central directory holds bytes past its last entry");
    return central;
  }

  // Fills each of `fields` holding the 0xFFFFFFFF placeholder from the zip64 extra field, in order.
  // false when the extra fields are malformed or the zip64 one is missing or short.
  static bool read_zip64_extra(const unsigned char* extra, size_t bytes, std::initializer_list<uint64_t*> fields) {
    size_t needed = 0;
    for (const uint64_t* f : fields) needed += *f == 0xFFFFFFFF ? 8 : 0;
    bool found = false;
    for (size_t e = 0; e < bytes;) {
      if (bytes - e < 4 || bytes - e - 4 < u16(extra + e + 2)) return false;
      const uint16_t id = u16(extra + e), len = u16(extra + e + 2);
      if (id == 0x0001 && !found) {
        if (len < needed) return false;
        size_t k = 0;
        for (uint64_t* f : fields)
          if (*f == 0xFFFFFFFF) *f = u64(extra + e + 4 + 8 * k++);
        found = true;
      }
      e += 4 + len;
    }
    return found || needed == 0;
  }

  // Every name valid and unique, all in one top-level folder, which is returned.
  std::string check_names(const std::vector<CentralEntry>& central) const {
    std::set<std::string> names;
    std::string folder;
    for (const CentralEntry& c : central) {
      const std::string reason = bad_name_reason(c.full_name);
      if (!reason.empty()) throw bad_entry(c, "the name has " + reason);
      if (!names.insert(c.full_name).second) throw bad_entry(c, "two entries have this name");
      const size_t slash = c.full_name.find('/');
      if (slash == std::string::npos || slash + 1 == c.full_name.size())
        throw bad_entry(c, "it is not a file inside a folder (a .pt2's entries all are)");
      const std::string first = c.full_name.substr(0, slash);
      if (folder.empty()) folder = first;
      if (first != folder) throw bad_entry(c, "it lies outside the archive's folder '" + folder + "'");
    }
    return folder;
  }

  void check_method(CentralEntry& c) const {
    if (c.flags & (kFlagEncrypted | kFlagStrongEncryption)) throw bad_entry(c, "encrypted entries are not supported");
    if (c.method != kStored && c.method != kDeflated)
      throw bad_entry(c, "compression method " + std::to_string(c.method) + " is not supported (stored and deflated are)");
    const ZipEntry& e = c.entry;
    if (c.method == kStored && e.size != e.compressed_size)
      throw bad_entry(c, "it is stored, yet its sizes differ (" + std::to_string(e.compressed_size) + " and " + std::to_string(e.size) + ")");
    if (c.method == kDeflated && e.size / kMaxDeflateRatio > e.compressed_size)
      throw bad_entry(c, "it claims " + std::to_string(e.size) + " bytes inflated from " + std::to_string(e.compressed_size) +
                             ", more than deflate can expand");
    c.entry.deflated = c.method == kDeflated;
  }

  // Checks the local header against the directory entry and sets the data offset; returns where the
  // entry's bytes end (its data, and its data descriptor when it has one).
  int64_t check_local_header(CentralEntry& c, int64_t directory_offset) const {
    if (c.header_offset > directory_offset - kLocalHeaderBytes) throw bad_entry(c, "its local header lies outside the data area");
    unsigned char h[kLocalHeaderBytes];
    read(c.header_offset, kLocalHeaderBytes, h);
    if (u32(h) != kLocalHeader) throw bad_entry(c, "no local header where the directory says");
    const uint16_t flags = u16(h + 6), method = u16(h + 8);
    const int64_t name_bytes = u16(h + 26), extra_bytes = u16(h + 28);
    const int64_t data_offset = c.header_offset + kLocalHeaderBytes + name_bytes + extra_bytes;
    if (method != c.method) throw bad_entry(c, "the local header's compression method " + std::to_string(method) +
                                                   " differs from the directory's " + std::to_string(c.method));
    const uint16_t checked_flags = kFlagEncrypted | kFlagDataDescriptor | kFlagStrongEncryption;
    if ((flags & checked_flags) != (c.flags & checked_flags)) throw bad_entry(c, "the local header's flags differ from the directory's");
    if (data_offset > directory_offset || c.entry.compressed_size > directory_offset - data_offset)
      throw bad_entry(c, "its data runs past the data area");
    std::vector<unsigned char> name_and_extra(static_cast<size_t>(name_bytes + extra_bytes));
    read(c.header_offset + kLocalHeaderBytes, name_bytes + extra_bytes, name_and_extra.data());
    if (std::string(reinterpret_cast<const char*>(name_and_extra.data()), static_cast<size_t>(name_bytes)) != c.full_name)
      throw bad_entry(c, "the local header names another file");
    uint64_t crc = u32(h + 14), compressed = u32(h + 18), uncompressed = u32(h + 22);
    if (!read_zip64_extra(name_and_extra.data() + name_bytes, static_cast<size_t>(extra_bytes), {&uncompressed, &compressed}))
      throw bad_entry(c, "the local header's extra fields are malformed");
    const ZipEntry& e = c.entry;
    const bool same = crc == e.crc32 && compressed == static_cast<uint64_t>(e.compressed_size) && uncompressed == static_cast<uint64_t>(e.size);
    c.entry.data_offset = data_offset;
    const int64_t data_end = data_offset + e.compressed_size;
    if (!(flags & kFlagDataDescriptor)) {
      if (!same) throw bad_entry(c, "the local header's CRC-32 or sizes differ from the directory's");
      return data_end;
    }
    // With a data descriptor the local header may hold zeros; the descriptor after the data holds the
    // values (with or without its signature, sizes of 4 or 8 bytes).
    if (!same && (crc | compressed | uncompressed) != 0) throw bad_entry(c, "the local header's CRC-32 or sizes differ from the directory's");
    unsigned char d[24] = {};
    const int64_t available = std::min<int64_t>(24, directory_offset - data_end);
    read(data_end, available, d);
    for (const bool signature : {true, false})
      for (const int64_t size_bytes : {4, 8}) {
        const int64_t at = signature ? 4 : 0, length = at + 4 + 2 * size_bytes;
        if (length > available || (signature && u32(d) != kDataDescriptor)) continue;
        const uint64_t dc = size_bytes == 4 ? u32(d + at + 4) : u64(d + at + 4);
        const uint64_t du = size_bytes == 4 ? u32(d + at + 4 + size_bytes) : u64(d + at + 4 + size_bytes);
        if (u32(d + at) == e.crc32 && dc == static_cast<uint64_t>(e.compressed_size) && du == static_cast<uint64_t>(e.size))
          return data_end + length;
      }
    throw bad_entry(c, "its data descriptor is missing or differs from the directory entry");
  }

  int fd_;
  const std::string& path_;
  int64_t file_size_;
};

}  // namespace

ZipArchive::ZipArchive(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DTensorError(path_ + ": cannot open it: " + std::strerror(errno));
  try {
    struct stat st{};
    if (::fstat(fd_, &st) != 0) throw DTensorError(path_ + ": cannot stat it: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw DTensorError(path_ + ": not a regular file");
    file_size_ = st.st_size;
    entries_ = DirectoryReader(fd_, path_, file_size_).entries(folder_);
    for (size_t i = 0; i < entries_.size(); ++i) by_name_.emplace(entries_[i].name, i);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

ZipArchive::~ZipArchive() { ::close(fd_); }

void ZipArchive::fail(const ZipEntry& entry, const std::string& what) const {
  throw DTensorError(path_ + ": zip entry '" + (folder_.empty() ? "" : folder_ + "/") + entry.name + "': " + what);
}


void ZipArchive::read_exact(int64_t offset, int64_t bytes, void* out, const ZipEntry& entry) const {
  const std::string error = read_at(fd_, offset, bytes, out);
  if (!error.empty()) fail(entry, error);
}

const ZipEntry* ZipArchive::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

namespace {

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

template <typename Sink>
void ZipArchive::stream(const ZipEntry& entry, char* destination, Sink&& sink) const {
  uLong crc = crc32_z(0, nullptr, 0);
  if (!entry.deflated) {
    std::vector<char> buffer(destination ? 0 : static_cast<size_t>(std::min(kChunk, entry.size)));
    for (int64_t done = 0; done < entry.size;) {
      const int64_t n = std::min(kChunk, entry.size - done);
      char* p = destination ? destination + done : buffer.data();
      read_exact(entry.data_offset + done, n, p, entry);
      crc = crc32_z(crc, reinterpret_cast<const Bytef*>(p), static_cast<z_size_t>(n));
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
      crc = crc32_z(crc, reinterpret_cast<const Bytef*>(out.data()), static_cast<z_size_t>(n));
      if (destination) std::memcpy(destination + produced, out.data(), static_cast<size_t>(n));
      else sink(produced, out.data(), n);
      produced += n;
    }
    if (produced != entry.size || read != entry.compressed_size || z.avail_in != 0)
      fail(entry, "its deflated data does not match its declared sizes");
  }
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // fuzzing: mutated records must reach the parsers behind this check
  if (crc != entry.crc32)
    fail(entry, "CRC-32 mismatch (the directory says " + hex(entry.crc32) + ", the data gives " + hex(static_cast<uint32_t>(crc)) +
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
