#pragma once
// Reading and validating a zip archive's directory (internal to src/io/; what is checked: zip_archive.h).

#include <cstdint>
#include <string>
#include <vector>

#include "zip_archive.h"

namespace dtensor::io::zip {

// The archive's files (names stripped of the top-level folder, which goes to `folder`), in directory
// order; directory entries, which zip tools add, are checked and left out. A DTensorError names `path`.
std::vector<ZipEntry> read_directory(int fd, const std::string& path, int64_t file_size, std::string& folder);

}  // namespace dtensor::io::zip
