#pragma once
// Crash-safe files: written under a temporary name in the same directory, fsync'd, then renamed over
// the final name, so a reader sees the old file or the whole new one, never a part. The rename itself
// is durable once the directory is fsync'd (sync_directory): the checkpoint writer does that once for
// all of a save's files, before and after its commit marker. A DurableFile dropped before commit()
// removes its temporary file.

#include <cstdint>
#include <string>

namespace dtensor::checkpoint::detail {

class DurableFile {
 public:
  explicit DurableFile(std::string final_path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(const void* data, int64_t bytes);
  // fsync, then rename to the final name.
  void commit();

 private:
  std::string final_path_;
  std::string temporary_path_;
  int fd_ = -1;
};

// The whole of `text` as the file `path` (fsync'd, renamed into place).
void write_durably(const std::string& path, const std::string& text);
// fsync of a directory, so renames and removals in it survive a crash.
void sync_directory(const std::string& dir);

}  // namespace dtensor::checkpoint::detail
