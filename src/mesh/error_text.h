#pragma once
// The text of an exception from LibTorch or Gloo as a dtensor error may quote it: without the C++
// stack frames c10 appends and without the "[source/file.cc:123] " locations Gloo puts in front,
// which tell a user nothing and bury what went wrong.

#include <exception>
#include <string>

namespace dtensor::detail {

std::string without_source_locations(const std::exception& e);

}  // namespace dtensor::detail
