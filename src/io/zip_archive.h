#pragma once
// A zip archive from an untrusted source (a .pt2 file), read without LibTorch's miniz reader so that
// every field is checked before use and every error names the file and the entry.
//
// Opening validates the whole directory: the end records (zip64 included) and the central
// directory are in bounds and consistent; every entry's local header agrees with its central
// directory entry on name, method, flags, CRC-32 and sizes (through the data descriptor when the
// writer used one, as PyTorch's does); entries neither overlap each other nor the directory; names
// are unique, relative, free of "." and ".." components and backslashes, and all lie in one top-level
// folder, which is stripped (as PyTorchStreamReader does). Only stored and deflated entries, without
// encryption, are accepted; directory entries (which zip tools add) must be empty and are left out.
//
// Reading checks the CRC-32 of every record as its bytes go by, so a flipped byte is an error, never
// a wrong value; partial reads stream the whole record for that reason (see read_ranges).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtensor::io {

struct ZipEntry {
  std::string name;  // inside the archive's folder: "models/model.json"
  bool deflated = false;
  uint32_t crc32 = 0;
  int64_t compressed_size = 0;
  int64_t size = 0;         // uncompressed
  int64_t data_offset = 0;  // of the (compressed) bytes in the file
};

// A piece of a record to copy out: `bytes` bytes from `offset` (in the uncompressed record) to `dst`.
struct RecordRange {
  int64_t offset;
  int64_t bytes;
  char* dst;
};

class ZipArchive {
 public:
  explicit ZipArchive(std::string path);
  // The archive held by the `length` bytes at `offset` of the file `path` (an item of a DCP .distcp
  // file, a torch.save'd zip): the range must lie inside the file; errors name `name` (the file and
  // the range) in place of the path.
  ZipArchive(std::string path, int64_t offset, int64_t length, std::string name);
  ~ZipArchive();
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }  // the path, or the path and the range
  const std::string& folder() const { return folder_; }  // the stripped top-level folder
  const std::vector<ZipEntry>& entries() const { return entries_; }
  // The entry named `name` inside the folder; nullptr when there is none.
  const ZipEntry* find(const std::string& name) const;

  // The whole record, CRC-checked; refused (naming `what`) when it is larger than `max_bytes`.
  std::string read_text(const ZipEntry& entry, int64_t max_bytes) const;
  // The whole record into `out` (entry.size bytes), CRC-checked.
  void read_into(const ZipEntry& entry, void* out) const;
  // Copies `ranges` (within [0, entry.size), any order) out of the record. The whole record streams
  // through a small buffer so that its CRC-32 is checked: the cost of reading one rank's part of a
  // weight is reading the weight, never holding it.
  void read_ranges(const ZipEntry& entry, std::vector<RecordRange> ranges) const;

  // "<file>: zip entry '<name>': <what>".
  [[noreturn]] void fail(const ZipEntry& entry, const std::string& what) const;

 private:
  // Streams the record's uncompressed bytes in order through `sink(offset, data, n)`, then checks the
  // size and CRC-32. A stored record whose `destination` is given is read straight into it.
  template <typename Sink>
  void stream(const ZipEntry& entry, char* destination, Sink&& sink) const;
  void read_exact(int64_t offset, int64_t bytes, void* out, const ZipEntry& entry) const;

  std::string path_;
  std::string name_;
  int fd_ = -1;
  int64_t base_ = 0;       // where the archive starts in the file
  int64_t file_size_ = 0;  // the archive's size
  std::string folder_;
  std::vector<ZipEntry> entries_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace dtensor::io
