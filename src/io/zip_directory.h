#pragma once
// Reading and validating a zip archive's directory (internal to src/io/; what is checked: zip_archive.h).

#include <cstdint>
#include <string>
#include <vector>

#include "zip_archive.h"

namespace dtensor::io::zip {

// The archive's files (names stripped of the top-level folder, which goes to `folder`), in directory
// order; directory entries, which zip tools add, are checked and left out. A DTensorError names `path`.
// The archive is the `size` bytes at `base` of the file (a whole file: base 0, its size); entries' data
// offsets are from `base`.
std::vector<ZipEntry> read_directory(int fd, const std::string& path, int64_t base, int64_t size, std::string& folder);

}  // namespace dtensor::io::zip
