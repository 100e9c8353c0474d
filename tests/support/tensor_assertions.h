#pragma once
// GoogleTest assertions comparing a tensor with its oracle (single-device LibTorch on the full
// tensors), shared by the single-process and the multi-rank tests.

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

namespace dtensor::testing {

::testing::AssertionResult tensors_equal(const at::Tensor& actual, const at::Tensor& expected);
::testing::AssertionResult tensors_close(const at::Tensor& actual, const at::Tensor& expected, double rtol = 1e-5,
                                         double atol = 1e-6);

}  // namespace dtensor::testing
