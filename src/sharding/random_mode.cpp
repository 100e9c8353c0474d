#include "dtensor/random.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "dtensor/errors.h"

namespace dtensor {
namespace {

RandomMode from_environment() {
  const char* value = std::getenv("DTENSOR_RANDOM_MODE");
  if (value == nullptr || std::string(value).empty() || std::string(value) == "exact") return RandomMode::Exact;
  if (std::string(value) == "local") return RandomMode::LocalShards;
  throw DTensorError("DTENSOR_RANDOM_MODE is '" + std::string(value) + "'; use 'exact' or 'local'");
}

std::atomic<int>& process_mode() {
  static std::atomic<int> mode{static_cast<int>(from_environment())};
  return mode;
}

thread_local int scoped_mode = -1;  // the innermost guard's mode on this thread; -1: none

}  // namespace

void set_random_mode(RandomMode mode) { process_mode() = static_cast<int>(mode); }

RandomMode random_mode() { return static_cast<RandomMode>(scoped_mode >= 0 ? scoped_mode : process_mode().load()); }

RandomModeGuard::RandomModeGuard(RandomMode mode) : previous_(scoped_mode) { scoped_mode = static_cast<int>(mode); }
RandomModeGuard::~RandomModeGuard() { scoped_mode = previous_; }

}  // namespace dtensor
