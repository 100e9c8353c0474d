#pragma once
// Integer arithmetic on values read from files. A crafted size, stride or offset must not wrap into a
// small number that passes a bounds check, so every sum and product of such values goes through
// these: nullopt where the exact result does not fit int64.

#include <cstdint>
#include <optional>
#include <vector>

namespace dtensor::io {

inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<int64_t> checked_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The element count of a shape whose dims are all non-negative; nullopt when it overflows. A shape
// with a 0 dim has 0 elements whatever the other dims are, as in LibTorch.
inline std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape) {
    const auto next = checked_mul(n, d);
    if (!next) return std::nullopt;
    n = *next;
  }
  return n;
}

// How many storage elements a strided view (non-negative sizes and strides) spans from its first
// element: 0 when it is empty, else 1 + sum((size - 1) * stride). nullopt when it overflows.
inline std::optional<int64_t> checked_extent(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  for (int64_t d : sizes)
    if (d == 0) return 0;
  int64_t extent = 1;
  for (size_t i = 0; i < sizes.size() && i < strides.size(); ++i) {
    const auto step = checked_mul(sizes[i] - 1, strides[i]);
    const auto next = step ? checked_add(extent, *step) : std::nullopt;
    if (!next) return std::nullopt;
    extent = *next;
  }
  return extent;
}

}  // namespace dtensor::io
