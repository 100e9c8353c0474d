#include "tensor_assertions.h"

#include <ATen/ATen.h>

namespace dtensor::testing {

::testing::AssertionResult tensors_equal(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != expected " << expected.sizes();
  if (actual.scalar_type() != expected.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << actual.scalar_type() << " != expected " << expected.scalar_type();
  if (at::equal(actual, expected)) return ::testing::AssertionSuccess();
  // Large tensors are described, not printed: a rank's failures travel through the store, whose
  // messages are capped (8 MiB), and nobody reads a million numbers.
  constexpr int64_t kPrintable = 400;
  if (actual.numel() <= kPrintable)
    return ::testing::AssertionFailure() << "values differ:\nactual\n" << actual << "\nexpected\n" << expected;
  const at::Tensor differs = actual.ne(expected).flatten();
  const int64_t first = differs.nonzero().min().item<int64_t>();
  return ::testing::AssertionFailure() << "values differ at " << differs.sum().item<int64_t>() << " of " << actual.numel()
                                       << " elements; the first (flat index " << first << "): actual "
                                       << actual.flatten()[first].item<double>() << ", expected "
                                       << expected.flatten()[first].item<double>();
}

::testing::AssertionResult tensors_close(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != expected " << expected.sizes();
  if (!at::allclose(actual, expected, rtol, atol))
    return ::testing::AssertionFailure() << "values differ (max abs diff "
                                         << (actual - expected).abs().max().item<double>() << ")";
  return ::testing::AssertionSuccess();
}

}  // namespace dtensor::testing
