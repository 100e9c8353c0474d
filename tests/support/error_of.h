#pragma once
// The text of the error an API call must raise, for tests that assert what it says.

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "dtensor/errors.h"

namespace dtensor::testing {

// The message of the DTensorError `fn` throws. Anything else it throws, or nothing, fails the test:
// the errors users see must be dtensor's own, naming what went wrong.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const DTensorError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a DTensorError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected a DTensorError";
  return "";
}

}  // namespace dtensor::testing
