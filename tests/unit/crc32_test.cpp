// dtensor's CRC-32 against zlib's (the oracle) at every length around the folding's block sizes, at
// every alignment, from any running value, and chained.

#include <gtest/gtest.h>
#include <zlib.h>

#include <random>
#include <vector>

#include "../../src/io/crc32.h"

namespace dtensor::unit {
namespace {

uint32_t zlib_crc(uint32_t crc, const unsigned char* p, size_t n) { return static_cast<uint32_t>(crc32_z(crc, p, n)); }

TEST(Crc32, EqualsZlibAtEveryLengthAlignmentAndStart) {
  std::mt19937 random(3);
  std::vector<unsigned char> bytes(4096 + 64);
  for (auto& b : bytes) b = static_cast<unsigned char>(random());
  for (size_t offset = 0; offset < 16; ++offset)
    for (size_t n = 0; n <= 300; ++n)
      for (const uint32_t start : {0u, 0xFFFFFFFFu, static_cast<uint32_t>(random())})
        ASSERT_EQ(io::crc32(start, bytes.data() + offset, n), zlib_crc(start, bytes.data() + offset, n))
            << "offset " << offset << ", " << n << " bytes, from " << start;
  for (const size_t n : {size_t{4096}, size_t{4095}, size_t{1000}, size_t{64 * 17 + 5}})
    EXPECT_EQ(io::crc32(0, bytes.data() + 3, n), zlib_crc(0, bytes.data() + 3, n)) << n;
}

TEST(Crc32, ChainedEqualsWhole) {
  std::vector<unsigned char> bytes(1 << 20);
  std::mt19937 random(5);
  for (auto& b : bytes) b = static_cast<unsigned char>(random());
  uint32_t chained = 0;
  for (size_t at = 0, step = 1; at < bytes.size(); at += step, step = step * 3 % 70001 + 1)
    chained = io::crc32(chained, bytes.data() + at, std::min(step, bytes.size() - at));
  EXPECT_EQ(chained, zlib_crc(0, bytes.data(), bytes.size()));
  EXPECT_EQ(io::crc32(0, bytes.data(), bytes.size()), chained);
}

}  // namespace
}  // namespace dtensor::unit
