// Proves the harness itself: a failure on one rank fails the test on rank 0 with that rank's message,
// and a rank that does not finish fails it by timeout. These tests are meant to fail, so they only
// run under the ctest `harness_reports_rank_failures`, which checks rank 0's report.

#include <cstdlib>
#include <thread>

#include "harness.h"

namespace dtensor::testing {
namespace {

bool self_test_requested() { return std::getenv("DTENSOR_HARNESS_SELF_TEST") != nullptr; }

class HarnessSelfTest : public DistTest {};

TEST_F(HarnessSelfTest, FailureOnOneRank) {
  if (!self_test_requested()) GTEST_SKIP() << "run by the harness_reports_rank_failures ctest";
  if (world()->rank() == 2) ADD_FAILURE() << "deliberate failure on rank 2";
}

TEST_F(HarnessSelfTest, HungRank) {
  if (!self_test_requested()) GTEST_SKIP() << "run by the harness_reports_rank_failures ctest";
  // Longer than the rank timeout the ctest sets (2 s).
  if (world()->rank() == 3) std::this_thread::sleep_for(std::chrono::seconds(4));
}

}  // namespace
}  // namespace dtensor::testing
