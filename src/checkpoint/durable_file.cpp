#include "durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "dtensor/errors.h"

namespace dtensor::checkpoint::detail {
namespace {

std::string system_error(const std::string& what, const std::string& path) {
  return "checkpoint: cannot " + what + " " + path + ": " + std::strerror(errno);
}

}  // namespace

DurableFile::DurableFile(std::string final_path) : final_path_(std::move(final_path)) {
  const std::filesystem::path p(final_path_);
  // A dot and a .tmp suffix: never mistaken for a checkpoint file (readers look for *.safetensors).
  temporary_path_ = (p.parent_path() / ("." + p.filename().string() + "." + std::to_string(getpid()) + ".tmp")).string();
  fd_ = ::open(temporary_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw DTensorError(system_error("create", temporary_path_));
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_path_.c_str());
  }
}

void DurableFile::write(const void* data, int64_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw DTensorError(system_error("write", temporary_path_));
    p += n;
    bytes -= n;
  }
}

void DurableFile::commit() {
  if (::fsync(fd_) != 0) throw DTensorError(system_error("fsync", temporary_path_));
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw DTensorError(system_error("close", temporary_path_));
  }
  fd_ = -1;
  if (::rename(temporary_path_.c_str(), final_path_.c_str()) != 0) {
    const std::string message = system_error("rename to " + final_path_ + ":", temporary_path_);
    ::unlink(temporary_path_.c_str());
    throw DTensorError(message);
  }
}

void write_durably(const std::string& path, const std::string& text) {
  DurableFile file(path);
  file.write(text.data(), static_cast<int64_t>(text.size()));
  file.commit();
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw DTensorError(system_error("open the directory", dir));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw DTensorError(system_error("fsync the directory", dir));
}

}  // namespace dtensor::checkpoint::detail
