#include "crc32.h"

#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dtensor::io {
namespace {

#if defined(__x86_64__)
#define DTENSOR_CLMUL __attribute__((target("pclmul,sse4.1")))

DTENSOR_CLMUL __m128i load(const unsigned char* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// One fold: `lane` carried on by the distance `k` encodes, added to the data it lands on.
DTENSOR_CLMUL __m128i fold(__m128i lane, __m128i k, __m128i onto) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(lane, k, 0x00), _mm_clmulepi64_si128(lane, k, 0x11)), onto);
}

// Folds `data` (`bytes` a multiple of 16, at least 64) into the CRC state `state` (the running CRC,
// inverted), in the bit-reflected domain of zip's polynomial P = 0x104C11DB7. The constants are the
// paper's: powers of x mod P for folding across 4x128 and 128 bits and from 64 bits to 32, then
// Barrett's reduction with floor(x^64 / P) and P.
DTENSOR_CLMUL uint32_t fold_by_clmul(uint32_t state, const unsigned char* data, size_t bytes) {
  const __m128i fold_512 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
  const __m128i fold_128 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
  const __m128i fold_64 = _mm_set_epi64x(0, 0x0163cd6124);
  const __m128i barrett = _mm_set_epi64x(0x01f7011641, 0x01db710641);
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  __m128i a = _mm_xor_si128(load(data), _mm_cvtsi32_si128(static_cast<int>(state)));
  __m128i b = load(data + 16), c = load(data + 32), d = load(data + 48);
  data += 64;
  bytes -= 64;
  for (; bytes >= 64; data += 64, bytes -= 64) {
    a = fold(a, fold_512, load(data));
    b = fold(b, fold_512, load(data + 16));
    c = fold(c, fold_512, load(data + 32));
    d = fold(d, fold_512, load(data + 48));
  }
  // Four lanes into one, then the remaining 16-byte blocks.
  __m128i x = fold(fold(fold(a, fold_128, b), fold_128, c), fold_128, d);
  for (; bytes >= 16; data += 16, bytes -= 16) x = fold(x, fold_128, load(data));

  // 128 bits to 64, then to 32 by Barrett reduction.
  x = _mm_xor_si128(_mm_srli_si128(x, 8), _mm_clmulepi64_si128(x, fold_128, 0x10));
  x = _mm_xor_si128(_mm_srli_si128(x, 4), _mm_clmulepi64_si128(_mm_and_si128(x, low32), fold_64, 0x00));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x, low32), barrett, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(x, t), 1));
}

bool has_clmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}

#endif

}  // namespace

uint32_t crc32(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (bytes >= 64 && has_clmul()) {
    const size_t folded = bytes & ~size_t{15};
    crc = ~fold_by_clmul(~crc, p, folded);
    p += folded;
    bytes -= folded;
  }
#endif
  return static_cast<uint32_t>(crc32_z(crc, p, bytes));
}

}  // namespace dtensor::io
