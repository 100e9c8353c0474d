#pragma once
// Golden files: text a test produces (a pass's printed program), compared with a file under
// tests/goldens/ that a diff tool and a review show. On a difference the failure prints a line diff.
// `dtensor_unit_tests --update-goldens` writes the files instead (then read `git diff tests/goldens`
// before committing: a golden changed is a behaviour changed).

#include <gtest/gtest.h>

#include <string>

namespace dtensor::testing {

// Set by the unit tests' main from --update-goldens.
void set_update_goldens(bool on);

// Compares `text` with tests/goldens/<relative> (or writes it there, with --update-goldens).
::testing::AssertionResult matches_golden(const std::string& relative, const std::string& text);

// A line diff of `expected` and `actual`: " " common, "-" expected only, "+" actual only.
std::string line_diff(const std::string& expected, const std::string& actual);

}  // namespace dtensor::testing
