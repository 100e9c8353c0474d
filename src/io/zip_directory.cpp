#include "zip_directory.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <tuple>

#include "dtensor/errors.h"
#include "zip_format.h"

namespace dtensor::io::zip {

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

namespace {

// Deflate cannot expand data by more than about 1032:1; a record claiming more is a forgery (a "zip
// bomb"), refused before anything is allocated for it.
constexpr int64_t kMaxDeflateRatio = 1032;

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

struct CentralEntry {
  ZipEntry entry;
  std::string full_name;
  uint16_t flags = 0, method = 0;
  int64_t header_offset = 0;
};

// Reads and validates the archive's directory (see zip_archive.h for what is checked).
class DirectoryReader {
 public:
  DirectoryReader(int fd, const std::string& path, int64_t base, int64_t file_size)
      : fd_(fd), path_(path), base_(base), file_size_(file_size) {}

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
      const bool directory = c.full_name.back() == '/';
      if (directory && c.entry.size != 0) throw bad_entry(c, "a directory entry holding data");
      if (!directory) entries.push_back(std::move(c.entry));
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
    const std::string error = read_at(fd_, base_ + offset, bytes, out);
    if (!error.empty()) throw corrupt(error);
  }

  // The end-of-central-directory record (the zip64 one when present, as PyTorch always writes it):
  // the entry count, and the central directory's offset and size.
  std::tuple<uint64_t, uint64_t, uint64_t> end_record() const {
    if (file_size_ < kEndBytes) throw corrupt("the file has " + std::to_string(file_size_) + " bytes, too few for a zip archive");
    // The last record whose comment ends exactly at the file's end. Archives rarely have a comment
    // (PyTorch's have none), so the last KiB is searched first: the search runs from the end, so what
    // it finds there is what a search of the whole 64 KiB a comment may take would find.
    std::vector<unsigned char> tail;
    int64_t tail_bytes = 0, found = -1;
    for (const int64_t wanted : {kEndBytes + 1024, kEndBytes + 0xFFFF}) {
      if (found >= 0 || tail_bytes == file_size_) break;
      tail_bytes = std::min<int64_t>(file_size_, wanted);
      tail.resize(static_cast<size_t>(tail_bytes));
      read(file_size_ - tail_bytes, tail_bytes, tail.data());
      for (int64_t i = tail_bytes - kEndBytes; i >= 0 && found < 0; --i)
        if (u32(&tail[i]) == kEndOfDirectory && i + kEndBytes + u16(&tail[i + 20]) == tail_bytes) found = i;
    }
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
      if (slash == std::string::npos) throw bad_entry(c, "it is not inside a folder (a .pt2's entries all are)");
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
    // The header with its name and extra fields in one read where they fit in what is read first
    // (PyTorch's do: a name and an extra field padding the data to 64 bytes); one read per part was
    // most of opening an archive of many small records.
    std::vector<unsigned char> header(static_cast<size_t>(std::min<int64_t>(kLocalHeaderBytes + 512, directory_offset - c.header_offset)));
    read(c.header_offset, static_cast<int64_t>(header.size()), header.data());
    const unsigned char* h = header.data();
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
    const auto read_first = static_cast<int64_t>(header.size());
    if (kLocalHeaderBytes + name_bytes + extra_bytes > read_first) {
      header.resize(static_cast<size_t>(kLocalHeaderBytes + name_bytes + extra_bytes));
      read(c.header_offset + read_first, kLocalHeaderBytes + name_bytes + extra_bytes - read_first, header.data() + read_first);
      h = header.data();
    }
    const unsigned char* name_and_extra = h + kLocalHeaderBytes;
    if (std::string(reinterpret_cast<const char*>(name_and_extra), static_cast<size_t>(name_bytes)) != c.full_name)
      throw bad_entry(c, "the local header names another file");
    uint64_t crc = u32(h + 14), compressed = u32(h + 18), uncompressed = u32(h + 22);
    if (!read_zip64_extra(name_and_extra + name_bytes, static_cast<size_t>(extra_bytes), {&uncompressed, &compressed}))
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
  int64_t base_;       // where the archive starts in the file
  int64_t file_size_;  // the archive's size
};

}  // namespace

std::vector<ZipEntry> read_directory(int fd, const std::string& path, int64_t base, int64_t size, std::string& folder) {
  return DirectoryReader(fd, path, base, size).entries(folder);
}

}  // namespace dtensor::io::zip
