#pragma once
// The zip format's fixed fields, shared by the directory reader and the record reader (internal to
// src/io/).

#include <cstdint>
#include <string>

namespace dtensor::io::zip {

inline constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEndOfDirectory = 0x06054b50;
inline constexpr uint32_t kZip64End = 0x06064b50, kZip64Locator = 0x07064b50, kDataDescriptor = 0x08074b50;
inline constexpr int64_t kLocalHeaderBytes = 30, kCentralHeaderBytes = 46, kEndBytes = 22, kZip64EndBytes = 56, kLocatorBytes = 20;
inline constexpr uint16_t kFlagEncrypted = 1, kFlagDataDescriptor = 8, kFlagStrongEncryption = 64;
inline constexpr uint16_t kStored = 0, kDeflated = 8;

// Little-endian fields of a byte buffer whose size the caller has checked.
inline uint16_t u16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t u32(const unsigned char* p) { return u16(p) | (static_cast<uint32_t>(u16(p + 2)) << 16); }
inline uint64_t u64(const unsigned char* p) { return u32(p) | (static_cast<uint64_t>(u32(p + 4)) << 32); }

// Reads exactly `bytes` at `offset` of `fd`; "" when done, else what went wrong.
std::string read_at(int fd, int64_t offset, int64_t bytes, void* out);

}  // namespace dtensor::io::zip
