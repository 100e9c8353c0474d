#pragma once
// CRC-32 (zip's, zlib's crc32) at memory speed: every record of a .pt2 is checked as it is read, so
// the check must cost little next to the read. Where the CPU has carry-less multiplication (PCLMULQDQ,
// every x86-64 of the last decade) blocks of 64 bytes are folded four 128-bit lanes at a time (Gopal
// et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", Intel, 2009); zlib's table
// method does the rest and runs everywhere else.

#include <cstddef>
#include <cstdint>

namespace dtensor::io {

// The running CRC-32 of `bytes` bytes at `data` after `crc` (0 to start), as zlib's crc32().
uint32_t crc32(uint32_t crc, const void* data, size_t bytes);

}  // namespace dtensor::io
